"""Dependencies: items that wait for their parents (migration ``0004_dependencies.sql``).

A child names its parents (``NewItem.after``: (topic, id) pairs of its namespace, on its
shard). It is enqueued *waiting* (``waiting_on`` = its parents not acked yet, its
``deliver_after`` far in the future, so the lease never sees it) with one edge per
parent. Acking a parent deletes its edges and counts each child down; the last one
releases the child (``deliver_after`` = its own due time, or now). Each step touches the
parent's edges and those children only: fan-out and fan-in cost one edge row per
(parent, child), never a scan of all children.

- **A parent must exist** (live, not dead) when its child is enqueued, or come earlier in
  the same batch: so a graph has no cycle, and an unknown id is refused. An acked item is
  not kept, so a child must be enqueued before its parents finish (best: in one call).
- **A parent that dies** makes its waiting children dead too (reason ``parent_failed``,
  and theirs, recursively), unless a child was enqueued ``on_parent_failure="run"``: that
  one counts the death as a resolution. The dead children keep their edges: replaying
  the parent replays them too, waiting again, and its success releases them.
- **A cancelled parent** cancels its children (and theirs).

Why each statement is its own, after the one that changed the parent, in the same
transaction: under READ COMMITTED each statement sees what committed before it started,
so an edge added by a concurrent enqueue (which holds the parent ``FOR SHARE`` until it
commits) is seen by the release that follows the parent's ack.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from asynctier.platform.errors import ParentRefused
from asynctier.queue.items import NewItem
from asynctier.queue.sql import DEAD, EDGES, ITEMS, NOW, WAITING_MS

#: Why a waiting child died: one of its parents died.
PARENT_FAILED = "parent_failed"

#: The parents of a batch that exist (live, locked against an ack until this transaction
#: commits) and those that are dead.
PARENTS_FOUND = f"""
WITH wanted AS (SELECT * FROM unnest(%(topics)s::text[], %(ids)s::text[]) AS w(topic, id))
SELECT 'live', i.topic, i.id FROM {ITEMS} i JOIN wanted w ON i.topic = w.topic AND i.id = w.id
WHERE i.namespace = %(ns)s AND i.id = ANY(%(ids)s::text[])
FOR SHARE OF i
"""

PARENTS_DEAD = f"""
SELECT d.topic, d.id, d.reason FROM {DEAD} d
JOIN unnest(%(topics)s::text[], %(ids)s::text[]) AS w(topic, id)
  ON d.topic = w.topic AND d.id = w.id
WHERE d.namespace = %(ns)s AND d.id = ANY(%(ids)s::text[])
"""

#: Hold the created children: waiting, their due time kept for their release.
HOLD = f"""
UPDATE {ITEMS} i
SET waiting_on = h.n, release_after = i.deliver_after, deliver_after = %(waiting_ms)s,
    on_parent_failure = h.opf, parents = h.parents::jsonb
FROM unnest(%(topics)s::text[], %(ids)s::text[], %(n)s::int[], %(opf)s::text[],
            %(parents)s::text[]) AS h(topic, id, n, opf, parents)
WHERE i.namespace = %(ns)s AND i.id = ANY(%(ids)s::text[]) AND i.topic = h.topic
  AND i.id = h.id
"""

ADD_EDGES = f"""
INSERT INTO {EDGES} (namespace, parent_topic, parent_id, child_topic, child_id)
SELECT %(ns)s, * FROM unnest(%(ptopics)s::text[], %(pids)s::text[], %(ctopics)s::text[],
                             %(cids)s::text[])
ON CONFLICT DO NOTHING
"""

#: After acks (or any end that is not a death): the edges of parents that are neither
#: live nor dead now are deleted and their children counted down; a child at zero is
#: released. A parent still leased by another owner (its ack here was not held) is live:
#: nothing happens.
RELEASE = f"""
WITH gone AS (
    DELETE FROM {EDGES} e
    WHERE e.namespace = %(ns)s AND e.parent_topic = %(topic)s
      AND e.parent_id = ANY(%(ids)b::text[])
      AND NOT EXISTS (SELECT 1 FROM {ITEMS} i WHERE i.namespace = %(ns)s
                      AND i.topic = %(topic)s AND i.id = e.parent_id)
      AND NOT EXISTS (SELECT 1 FROM {DEAD} d WHERE d.namespace = %(ns)s
                      AND d.topic = %(topic)s AND d.id = e.parent_id)
    RETURNING e.child_topic, e.child_id
), counted AS (
    SELECT child_topic, child_id, count(*)::int AS n FROM gone GROUP BY 1, 2
)
UPDATE {ITEMS} c
SET waiting_on = c.waiting_on - k.n,
    deliver_after = CASE WHEN c.waiting_on - k.n <= 0
                         THEN GREATEST(c.release_after, {NOW}) ELSE c.deliver_after END,
    released_ms = CASE WHEN c.waiting_on - k.n <= 0 THEN {NOW} ELSE NULL END
FROM counted k
WHERE c.namespace = %(ns)s AND c.topic = k.child_topic AND c.id = k.child_id
  AND c.waiting_on > 0
RETURNING c.topic, c.waiting_on <= 0
"""

#: After deaths: every waiting descendant that fails with its parent dies parent_failed
#: (its edges kept for a replay); the 'run' children of every dead one are counted down.
PROPAGATE = f"""
WITH RECURSIVE failed(topic, id, cause) AS (
    SELECT d.topic, d.id, d.topic || '/' || d.id FROM {DEAD} d
    WHERE d.namespace = %(ns)s AND d.topic = %(topic)s AND d.id = ANY(%(ids)s::text[])
  UNION
    SELECT c.topic, c.id, f.cause FROM failed f
    JOIN {EDGES} e ON e.namespace = %(ns)s AND e.parent_topic = f.topic
                  AND e.parent_id = f.id
    JOIN {ITEMS} c ON c.namespace = %(ns)s AND c.topic = e.child_topic AND c.id = e.child_id
    WHERE c.on_parent_failure = 'fail' AND c.waiting_on > 0
), doomed AS (
    SELECT DISTINCT ON (topic, id) topic, id, cause FROM failed
    WHERE NOT (topic = %(topic)s AND id = ANY(%(ids)s::text[]))
), removed AS (
    DELETE FROM {ITEMS} i USING doomed d
    WHERE i.namespace = %(ns)s AND i.topic = d.topic AND i.id = d.id
    RETURNING i.*, '{PARENT_FAILED}' AS reason,
              'its parent ' || d.cause || ' died: replay it (asynctier queue replay) and '
              || 'this item comes back with it' AS error
), buried AS (
    INSERT INTO {DEAD} (namespace, topic, id, priority, payload, headers, attempts,
                        enqueued_ms, reason, error, dead_ms, on_parent_failure, parents)
    SELECT namespace, topic, id, priority, payload, headers, attempts, enqueued_ms,
           reason, error, {NOW}, on_parent_failure, parents FROM removed
    ON CONFLICT (namespace, topic, id) DO UPDATE SET
        reason = EXCLUDED.reason, error = EXCLUDED.error, dead_ms = EXCLUDED.dead_ms,
        payload = EXCLUDED.payload, parents = EXCLUDED.parents
    RETURNING topic, id
), runs AS (
    DELETE FROM {EDGES} e USING failed f, {ITEMS} c
    WHERE e.namespace = %(ns)s AND e.parent_topic = f.topic AND e.parent_id = f.id
      AND c.namespace = %(ns)s AND c.topic = e.child_topic AND c.id = e.child_id
      AND c.on_parent_failure = 'run'
    RETURNING e.child_topic, e.child_id
), counted AS (
    SELECT child_topic, child_id, count(*)::int AS n FROM runs GROUP BY 1, 2
), released AS (
    UPDATE {ITEMS} c
    SET waiting_on = c.waiting_on - k.n,
        deliver_after = CASE WHEN c.waiting_on - k.n <= 0
                             THEN GREATEST(c.release_after, {NOW}) ELSE c.deliver_after END,
        released_ms = CASE WHEN c.waiting_on - k.n <= 0 THEN {NOW} ELSE NULL END
    FROM counted k
    WHERE c.namespace = %(ns)s AND c.topic = k.child_topic AND c.id = k.child_id
      AND c.waiting_on > 0
    RETURNING c.id
)
SELECT (SELECT count(*) FROM buried), (SELECT count(*) FROM released)
"""

#: After a replay: the parent_failed dead descendants of the replayed items come back,
#: each waiting for its parents whose edges remain (those not acked yet).
REPLAY_CHILDREN = f"""
WITH RECURSIVE family(topic, id) AS (
    SELECT %(topic)s::text, unnest(%(ids)s::text[])
  UNION
    SELECT d.topic, d.id FROM family f
    JOIN {EDGES} e ON e.namespace = %(ns)s AND e.parent_topic = f.topic
                  AND e.parent_id = f.id
    JOIN {DEAD} d ON d.namespace = %(ns)s AND d.topic = e.child_topic AND d.id = e.child_id
    WHERE d.reason = '{PARENT_FAILED}'
), moved AS (
    DELETE FROM {DEAD} d USING family f
    WHERE d.namespace = %(ns)s AND d.topic = f.topic AND d.id = f.id
      AND d.reason = '{PARENT_FAILED}'
      AND NOT EXISTS (SELECT 1 FROM {ITEMS} i WHERE i.namespace = d.namespace
                      AND i.topic = d.topic AND i.id = d.id)
    RETURNING d.*
), waits AS (
    SELECT m.topic, m.id, (SELECT count(*) FROM {EDGES} e WHERE e.namespace = %(ns)s
                           AND e.child_topic = m.topic AND e.child_id = m.id)::int AS n
    FROM moved m
)
INSERT INTO {ITEMS} (namespace, topic, id, priority, deliver_after, payload, headers,
                     attempts, enqueued_ms, last_error, waiting_on, release_after,
                     on_parent_failure, parents)
SELECT m.namespace, m.topic, m.id, m.priority,
       CASE WHEN w.n > 0 THEN %(waiting_ms)s ELSE {NOW} END, m.payload, m.headers, 0,
       m.enqueued_ms, m.error, w.n, {NOW}, m.on_parent_failure, m.parents
FROM moved m JOIN waits w ON w.topic = m.topic AND w.id = m.id
ON CONFLICT DO NOTHING
RETURNING id
"""

#: Cancel an item and every descendant (live or dead), and their edges.
CANCEL = f"""
WITH RECURSIVE family(topic, id) AS (
    SELECT %(topic)s::text, %(id)s::text
  UNION
    SELECT e.child_topic, e.child_id FROM family f
    JOIN {EDGES} e ON e.namespace = %(ns)s AND e.parent_topic = f.topic
                  AND e.parent_id = f.id
), a AS (DELETE FROM {ITEMS} i USING family f WHERE i.namespace = %(ns)s
         AND i.topic = f.topic AND i.id = f.id RETURNING i.topic, i.id),
   b AS (DELETE FROM {DEAD} d USING family f WHERE d.namespace = %(ns)s
         AND d.topic = f.topic AND d.id = f.id RETURNING d.topic, d.id),
   c AS (DELETE FROM {EDGES} e USING family f WHERE e.namespace = %(ns)s
         AND ((e.parent_topic = f.topic AND e.parent_id = f.id)
              OR (e.child_topic = f.topic AND e.child_id = f.id)) RETURNING 1)
SELECT (SELECT count(*) FROM a WHERE topic = %(topic)s AND id = %(id)s)
     + (SELECT count(*) FROM b WHERE topic = %(topic)s AND id = %(id)s),
       (SELECT count(*) FROM a) + (SELECT count(*) FROM b), (SELECT count(*) FROM c)
"""

#: The item's waiting children (their edges from it remain).
CHILDREN = f"""
SELECT child_topic, child_id FROM {EDGES}
WHERE namespace = %s AND parent_topic = %s AND parent_id = %s
ORDER BY child_topic, child_id LIMIT %s
"""

#: Each parent's state: live (with whether it is waiting itself), dead, or gone (acked).
PARENT_STATES = f"""
SELECT w.topic, w.id,
       CASE WHEN i.id IS NOT NULL THEN
                CASE WHEN i.waiting_on > 0 THEN 'waiting'
                     WHEN i.lease_owner IS NOT NULL AND i.deliver_after > {NOW} THEN 'leased'
                     WHEN i.deliver_after > {NOW} THEN 'delayed' ELSE 'ready' END
            WHEN d.id IS NOT NULL THEN 'dead'
            ELSE 'succeeded' END
FROM unnest(%(topics)s::text[], %(ids)s::text[]) WITH ORDINALITY AS w(topic, id, ord)
LEFT JOIN {ITEMS} i ON i.namespace = %(ns)s AND i.topic = w.topic AND i.id = w.id
LEFT JOIN {DEAD} d ON d.namespace = %(ns)s AND d.topic = w.topic AND d.id = w.id
ORDER BY w.ord
"""

def hold_children(conn: psycopg.Connection[Any], namespace: str, items: Sequence[NewItem],
                  ids: Sequence[str], created: set[tuple[str, str]]) -> None:
    """After the batch's insert (same transaction): check every parent, hold the created
    children and add their edges. ParentRefused (the caller's transaction rolls back) when a
    parent is unknown, dead, or later in the batch."""
    position = {(item.topic, item_id): n for n, (item, item_id)
                in enumerate(zip(items, ids, strict=True))}
    wanted: set[tuple[str, str]] = set()
    for n, item in enumerate(items):
        for parent in item.after:
            at = position.get(parent)
            if at is not None and at >= n:
                raise ParentRefused(n, ids[n], item.topic, parent,
                                    "comes later in the batch; put parents first (a graph "
                                    "may have no cycle)")
            wanted.add(parent)
    _check_parents(conn, namespace, items, ids, wanted)
    children = [(item, item_id) for item, item_id in zip(items, ids, strict=True)
                if item.after and (item.topic, item_id) in created]
    if not children:
        return
    conn.execute(HOLD, {
        "ns": namespace, "waiting_ms": WAITING_MS,
        "topics": [i.topic for i, _ in children], "ids": [c for _, c in children],
        "n": [len(set(i.after)) for i, _ in children],
        "opf": [i.on_parent_failure for i, _ in children],
        "parents": [json.dumps([list(p) for p in i.after]) for i, _ in children]})
    edges = [(p, (i.topic, c)) for i, c in children for p in set(i.after)]
    conn.execute(ADD_EDGES, {
        "ns": namespace, "ptopics": [p[0] for p, _ in edges], "pids": [p[1] for p, _ in edges],
        "ctopics": [c[0] for _, c in edges], "cids": [c[1] for _, c in edges]})


def _check_parents(conn: psycopg.Connection[Any], namespace: str, items: Sequence[NewItem],
                   ids: Sequence[str], wanted: set[tuple[str, str]]) -> None:
    refs = sorted(wanted)
    params = {"ns": namespace, "topics": [t for t, _ in refs], "ids": [i for _, i in refs]}
    live = {(r[1], r[2]) for r in conn.execute(PARENTS_FOUND, params).fetchall()}
    missing = [ref for ref in refs if ref not in live]
    if not missing:
        return
    dead = {(r[0], r[1]): r[2] for r in conn.execute(PARENTS_DEAD, params).fetchall()}
    ref = missing[0]
    n, item = next((n, i) for n, i in enumerate(items) if ref in i.after)
    if ref in dead:
        raise ParentRefused(n, ids[n], item.topic, ref,
                            f"is dead ({dead[ref]}): replay it first (asynctier queue replay "
                            f"{ref[0]} --id {ref[1]}), or leave it out")
    raise ParentRefused(n, ids[n], item.topic, ref,
                        f"is not in namespace {namespace!r}: enqueue parents first (or earlier "
                        "in the same batch); an acked item is not kept, so enqueue a child "
                        "before its parents finish")


def propagate(conn: psycopg.Connection[Any], namespace: str, topic: str,
              ids: Sequence[str]) -> tuple[int, int]:
    """The deaths of ``ids`` reach their children: (children dead parent_failed,
    'run' children counted down)."""
    row = conn.execute(PROPAGATE, {"ns": namespace, "topic": topic,
                                   "ids": list(ids)}).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def replay_children(conn: psycopg.Connection[Any], namespace: str, topic: str,
                    ids: Sequence[str]) -> int:
    """Bring back the parent_failed descendants of the replayed ``ids``, waiting again."""
    return len(conn.execute(REPLAY_CHILDREN, {"ns": namespace, "topic": topic,
                                              "ids": list(ids),
                                              "waiting_ms": WAITING_MS}).fetchall())
