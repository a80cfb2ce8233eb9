-- The queue's schema: items waiting or leased, dead items, the topics seen.
--
-- A leased item's deliver_after is its lease's expiry: "ready" is then one condition
-- (deliver_after <= now) that the lease index serves, and an item whose lease ran out
-- is ready again with no sweeper.

CREATE FUNCTION asynctier_queue_now_ms() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint $$;

CREATE TABLE asynctier_queue_items (
    namespace     text    NOT NULL,
    topic         text    NOT NULL,
    id            text    NOT NULL,
    seq           bigserial,                 -- enqueue order
    priority      integer NOT NULL DEFAULT 0,
    deliver_after bigint  NOT NULL,          -- epoch ms; a leased item's lease expiry
    payload       bytea   NOT NULL,
    headers       jsonb,                     -- [[name, base64 or null], ...]; null: none
    attempts      integer NOT NULL DEFAULT 0,
    lease_owner   text,
    lease_expires bigint,                    -- epoch ms
    enqueued_ms   bigint  NOT NULL,
    expires_ms    bigint,                    -- epoch ms (ttl); null: never
    last_error    text    NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, topic, id)
) WITH (
    -- A queue table churns: each item is inserted, updated (leased) and deleted (acked).
    -- Vacuum it after every 1,000 dead rows whatever its size, at full speed.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05,
    fillfactor = 90
);

-- "Priority-based ordering demands a secondary index": the lease query walks it.
CREATE INDEX asynctier_queue_items_lease
    ON asynctier_queue_items (namespace, topic, priority DESC, deliver_after, seq);

CREATE TABLE asynctier_queue_dead (
    namespace   text    NOT NULL,
    topic       text    NOT NULL,
    id          text    NOT NULL,
    priority    integer NOT NULL,
    payload     bytea   NOT NULL,
    headers     jsonb,
    attempts    integer NOT NULL,
    enqueued_ms bigint  NOT NULL,
    reason      text    NOT NULL,
    error       text    NOT NULL DEFAULT '',
    dead_ms     bigint  NOT NULL,
    PRIMARY KEY (namespace, topic, id)
);

CREATE INDEX asynctier_queue_dead_order ON asynctier_queue_dead (namespace, topic, dead_ms);

CREATE TABLE asynctier_queue_topics (
    namespace  text   NOT NULL,
    topic      text   NOT NULL,
    created_ms bigint NOT NULL DEFAULT asynctier_queue_now_ms(),
    PRIMARY KEY (namespace, topic)
);
