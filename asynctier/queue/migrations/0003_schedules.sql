-- Schedules (asynctier.schedules): each lives on the shard of the queue topic it feeds,
-- so a tick's item and the schedule's advance commit in one transaction.
--
-- next_ms: the next tick not fired yet (epoch ms, the database's clock); a firing locks
-- the row (FOR UPDATE SKIP LOCKED), enqueues the tick's item and moves next_ms on in one
-- transaction: the same tick cannot fire twice, whatever the number of processes.
-- version: bumped by every edit; a firing holds the row lock, so an edit waits for it.

CREATE TABLE asynctier_schedules (
    namespace        text    NOT NULL,
    name             text    NOT NULL,
    topic            text    NOT NULL,
    cron             text,
    every_s          integer,
    timezone         text    NOT NULL DEFAULT 'UTC',
    payload          text    NOT NULL DEFAULT '{}',
    priority         integer NOT NULL DEFAULT 0,
    expire_s         double precision,
    catch_up         text    NOT NULL DEFAULT 'none',
    catch_up_max     integer NOT NULL DEFAULT 100,
    grace_s          double precision NOT NULL DEFAULT 10,
    version          integer NOT NULL DEFAULT 1,
    paused           boolean NOT NULL DEFAULT false,
    next_ms          bigint  NOT NULL,
    last_tick_ms     bigint,
    last_fired_ms    bigint,
    last_lateness_ms bigint,
    fired            bigint  NOT NULL DEFAULT 0,
    skipped          bigint  NOT NULL DEFAULT 0,
    error            text    NOT NULL DEFAULT '',
    created_ms       bigint  NOT NULL DEFAULT asynctier_queue_now_ms(),
    updated_ms       bigint  NOT NULL DEFAULT asynctier_queue_now_ms(),
    PRIMARY KEY (namespace, name)
);

-- The firing walks the due schedules in tick order.
CREATE INDEX asynctier_schedules_due ON asynctier_schedules (next_ms) WHERE NOT paused;
