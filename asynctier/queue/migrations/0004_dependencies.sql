-- Dependencies: an item may wait for other items (its parents) of its namespace and shard.
--
-- waiting_on: parents not acked yet; while above 0 the item's deliver_after is far in the
-- future (so no lease sees it) and release_after keeps the time it is due once released.
-- parents: [[topic, id], ...] as enqueued, for `queue show`. released_ms: when its last
-- parent was acked (the time it waited is released_ms - enqueued_ms).
-- An edge per (parent, child) still to be resolved: acking the parent deletes its edges
-- and counts its children down; a parent that dies makes its 'fail' children dead
-- (reason parent_failed) and keeps those edges, so replaying the parent brings them back.

ALTER TABLE asynctier_queue_items
    ADD COLUMN waiting_on        integer NOT NULL DEFAULT 0,
    ADD COLUMN release_after     bigint,
    ADD COLUMN on_parent_failure text    NOT NULL DEFAULT 'fail',
    ADD COLUMN parents           jsonb,
    ADD COLUMN released_ms       bigint;

ALTER TABLE asynctier_queue_dead
    ADD COLUMN on_parent_failure text NOT NULL DEFAULT 'fail',
    ADD COLUMN parents           jsonb;

CREATE TABLE asynctier_queue_edges (
    namespace    text NOT NULL,
    parent_topic text NOT NULL,
    parent_id    text NOT NULL,
    child_topic  text NOT NULL,
    child_id     text NOT NULL,
    PRIMARY KEY (namespace, parent_topic, parent_id, child_topic, child_id)
);

CREATE INDEX asynctier_queue_edges_child
    ON asynctier_queue_edges (namespace, child_topic, child_id);
