-- Long runs: a leased item's progress, for checkpoints and for `asynctier queue stats`.
--
-- checkpoint / checkpoint_kind ('json' or 'bytes') / checkpoint_ms: the last state the
-- function saved with ctx.checkpoint (kept across nacks and lost leases, sent with the
-- item on every later lease; gone with the item when it is acked or dies).
-- leased_ms: when the current lease began (a running item's age); heartbeat_ms: when its
-- lease was last extended because its scheduler reported it alive.

ALTER TABLE asynctier_queue_items
    ADD COLUMN checkpoint      bytea,
    ADD COLUMN checkpoint_kind text,
    ADD COLUMN checkpoint_ms   bigint,
    ADD COLUMN leased_ms       bigint,
    ADD COLUMN heartbeat_ms    bigint;
