"""The queue store's statements: one statement per batch operation.

Time is always the database's (``asynctier_queue_now_ms()``, the statement's start), so
producers, tailers and the clock that expires leases agree. A leased item's
``deliver_after`` is its lease expiry: "ready" is ``deliver_after <= now`` alone, which
the lease index (namespace, topic, priority DESC, deliver_after, seq) serves for each
priority.

A statement that touches a batch of items by id names them with ``id = ANY(array)`` as
well as by its join: the planner then reads them through the primary key instead of
hashing the whole topic (with the join alone a lease was mostly a sequential scan).
"""

from __future__ import annotations

ITEMS = "asynctier_queue_items"
DEAD = "asynctier_queue_dead"
TOPICS = "asynctier_queue_topics"
EDGES = "asynctier_queue_edges"
NOW = "asynctier_queue_now_ms()"
#: The deliver_after of an item waiting for its parents: later than any lease looks.
WAITING_MS = 2**62

#: The error of an item that died because its last attempt's lease ran out.
LEASE_RAN_OUT = "its lease ran out on its last attempt (the scheduler running it died?)"

_BURY = f"""
INSERT INTO {DEAD} (namespace, topic, id, priority, payload, headers, attempts,
                    enqueued_ms, reason, error, dead_ms, on_parent_failure, parents)
SELECT namespace, topic, id, priority, payload, headers, attempts, enqueued_ms,
       reason, error, {NOW}, on_parent_failure, parents FROM removed
ON CONFLICT (namespace, topic, id) DO UPDATE SET
    priority = EXCLUDED.priority, payload = EXCLUDED.payload, headers = EXCLUDED.headers,
    attempts = EXCLUDED.attempts, enqueued_ms = EXCLUDED.enqueued_ms,
    reason = EXCLUDED.reason, error = EXCLUDED.error, dead_ms = EXCLUDED.dead_ms,
    on_parent_failure = EXCLUDED.on_parent_failure, parents = EXCLUDED.parents
RETURNING id
"""

#: Parameters in binary (``%b``): psycopg dumps and PostgreSQL parses the arrays far
#: cheaper than as text, on the client and on the server (``make bench-queue``).
ENQUEUE = f"""
WITH input AS (
    SELECT * FROM unnest(%(ids)b::text[], %(topics)b::text[], %(priorities)b::int[],
                         %(after)b::bigint[], %(payloads)b::bytea[], %(headers)b::text[],
                         %(ttl_ms)b::bigint[], %(delay_ms)b::bigint[])
        WITH ORDINALITY AS t(id, topic, priority, deliver_after, payload, headers, ttl_ms,
                             delay_ms, ord)
), seen AS (
    INSERT INTO {TOPICS} (namespace, topic)
    SELECT DISTINCT %(ns)b::text, topic FROM input
    ON CONFLICT DO NOTHING
)
INSERT INTO {ITEMS} (namespace, topic, id, priority, deliver_after, payload, headers,
                     enqueued_ms, expires_ms)
SELECT %(ns)b, topic, id, priority, COALESCE(deliver_after, {NOW} + delay_ms, {NOW}), payload,
       headers::jsonb, {NOW}, {NOW} + ttl_ms
FROM input ORDER BY ord
ON CONFLICT DO NOTHING
RETURNING topic, id
"""

#: An enqueue by ``COPY`` (items without parents, in batches of :data:`COPY_FROM` or
#: more) first upserts the topics and reads the database's time, which the items' times
#: are computed from, then copies the rows in binary.
SEEN_NOW = f"""
WITH seen AS (
    INSERT INTO {TOPICS} (namespace, topic)
    SELECT %(ns)s, topic FROM unnest(%(topics)s::text[]) AS t(topic)
    ON CONFLICT DO NOTHING
)
SELECT {NOW}
"""

COPY_ITEMS = f"""
COPY {ITEMS} (namespace, topic, id, priority, deliver_after, payload, headers,
              enqueued_ms, expires_ms) FROM STDIN (FORMAT BINARY)
"""
COPY_TYPES = ("text", "text", "text", "int4", "int8", "bytea", "jsonb", "int8", "int8")

#: Wake the listeners of these ``namespace<TAB>topic`` keys (delivered at commit).
NOTIFY_READY = """
SELECT pg_notify('asynctier_queue', key) FROM unnest(%(keys)s::text[]) AS k(key)
"""

#: The lease walks the topic one priority at a time, highest first: the priorities present
#: found by a skip scan (one index probe each), then in each the ready items, where
#: ``deliver_after <= now`` bounds the index scan. One ordered scan of the whole topic
#: would read through every delayed and leased item of a priority before the next one.
#: Rows are locked as the outer LIMIT pulls them, so no more than ``n`` are locked, in
#: the order the priorities come.
LEASE = f"""
WITH RECURSIVE priorities AS (
    (SELECT priority FROM {ITEMS} WHERE namespace = %(ns)s AND topic = %(topic)s
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT i.priority FROM {ITEMS} i
            WHERE i.namespace = %(ns)s AND i.topic = %(topic)s AND i.priority < p.priority
            ORDER BY i.priority DESC LIMIT 1)
    FROM priorities p WHERE p.priority IS NOT NULL
), picked AS (
    SELECT r.* FROM priorities p CROSS JOIN LATERAL (
        SELECT id, deliver_after, attempts, lease_owner, expires_ms, last_error
        FROM {ITEMS}
        WHERE namespace = %(ns)s AND topic = %(topic)s AND priority = p.priority
          AND deliver_after <= {NOW}
        ORDER BY deliver_after, seq
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ) r
    LIMIT %(n)s
), doomed AS (
    SELECT id,
           CASE WHEN expires_ms <= {NOW} THEN 'expired' ELSE 'max_attempts' END AS reason,
           CASE WHEN expires_ms <= {NOW} THEN 'its time to live ran out before it was leased'
                WHEN lease_owner IS NOT NULL THEN '{LEASE_RAN_OUT}'
                ELSE last_error END AS error
    FROM picked
    WHERE expires_ms <= {NOW} OR attempts >= %(max_attempts)s::int
), removed AS (
    DELETE FROM {ITEMS} i USING doomed d
    WHERE i.namespace = %(ns)s AND i.topic = %(topic)s
      AND i.id = ANY(ARRAY(SELECT id FROM doomed)) AND i.id = d.id
    RETURNING i.*, d.reason, d.error
), buried AS ({_BURY}), leased AS (
    UPDATE {ITEMS} i
    SET attempts = i.attempts + 1, lease_owner = %(owner)s,
        lease_expires = {NOW} + %(lease_ms)s, deliver_after = {NOW} + %(lease_ms)s,
        leased_ms = {NOW}, heartbeat_ms = {NOW}
    FROM picked p
    WHERE i.namespace = %(ns)s AND i.topic = %(topic)s
      AND i.id = ANY(ARRAY(SELECT id FROM picked)) AND i.id = p.id
      AND p.id NOT IN (SELECT id FROM doomed)
    RETURNING i.id, i.payload, i.headers, i.priority, i.attempts, i.enqueued_ms,
              p.deliver_after, i.lease_expires, i.seq,
              p.lease_owner IS NOT NULL AS lease_ran_out, i.checkpoint, i.checkpoint_kind
)
SELECT * FROM leased
UNION ALL  -- one row (id NULL, its id last) per item moved to the dead items instead
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, id FROM doomed
"""

ACK = f"""
DELETE FROM {ITEMS}
WHERE namespace = %(ns)s AND topic = %(topic)s AND id = ANY(%(ids)b::text[])
  AND lease_owner = %(owner)s
RETURNING id
"""

NACK = f"""
UPDATE {ITEMS} i
SET deliver_after = {NOW} + n.delay_ms, lease_owner = NULL, lease_expires = NULL,
    leased_ms = NULL, heartbeat_ms = NULL,
    attempts = GREATEST(0, i.attempts - CASE WHEN n.spend THEN 0 ELSE 1 END),
    last_error = CASE WHEN n.error = '' THEN i.last_error ELSE n.error END
FROM unnest(%(ids)b::text[], %(delay_ms)b::bigint[], %(spend)b::bool[], %(errors)b::text[])
     AS n(id, delay_ms, spend, error)
WHERE i.namespace = %(ns)s AND i.topic = %(topic)s AND i.id = ANY(%(ids)b::text[])
  AND i.id = n.id AND i.lease_owner = %(owner)s
RETURNING i.id
"""

BURY = f"""
WITH removed AS (
    DELETE FROM {ITEMS} i
    USING unnest(%(ids)b::text[], %(reasons)b::text[], %(errors)b::text[]) AS d(id, reason, error)
    WHERE i.namespace = %(ns)s AND i.topic = %(topic)s AND i.id = ANY(%(ids)b::text[])
      AND i.id = d.id AND i.lease_owner = %(owner)s
    RETURNING i.*, d.reason, d.error
){_BURY}
"""

EXTEND = f"""
UPDATE {ITEMS}
SET lease_expires = {NOW} + %(lease_ms)s, deliver_after = {NOW} + %(lease_ms)s,
    heartbeat_ms = {NOW}
WHERE namespace = %(ns)s AND topic = %(topic)s AND id = ANY(%(ids)b::text[])
  AND lease_owner = %(owner)s
RETURNING id
"""

GET_LIVE = f"""
SELECT id, priority, payload, headers, attempts, enqueued_ms, deliver_after, lease_owner,
       lease_expires, expires_ms, last_error, {NOW}, leased_ms, heartbeat_ms,
       octet_length(checkpoint), checkpoint_ms, waiting_on, parents, released_ms
FROM {ITEMS} WHERE namespace = %s AND topic = %s AND id = %s
"""

GET_DEAD = f"""
SELECT id, priority, payload, headers, attempts, enqueued_ms, reason, error, dead_ms, parents
FROM {DEAD} WHERE namespace = %s AND topic = %s AND id = %s
"""

COUNTS = f"""
WITH clock AS (SELECT {NOW} AS ms),
live AS (
    SELECT topic,
           count(*) FILTER (WHERE deliver_after <= clock.ms) AS ready,
           count(*) FILTER (WHERE deliver_after > clock.ms AND lease_owner IS NULL
                            AND waiting_on = 0) AS delayed,
           count(*) FILTER (WHERE deliver_after > clock.ms AND lease_owner IS NOT NULL)
               AS leased,
           min(deliver_after) FILTER (WHERE deliver_after <= clock.ms) AS oldest,
           count(*) FILTER (WHERE waiting_on > 0) AS waiting
    FROM {ITEMS}, clock
    WHERE namespace = %(ns)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
    GROUP BY topic
), dead AS (
    SELECT topic, count(*) AS dead FROM {DEAD}
    WHERE namespace = %(ns)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
    GROUP BY topic
), known AS (
    SELECT topic FROM {TOPICS}
    WHERE namespace = %(ns)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
    UNION SELECT topic FROM live UNION SELECT topic FROM dead
)
SELECT k.topic, COALESCE(l.ready, 0), COALESCE(l.delayed, 0), COALESCE(l.leased, 0),
       COALESCE(d.dead, 0), COALESCE((clock.ms - l.oldest) / 1000.0, 0),
       COALESCE(l.waiting, 0)
FROM known k LEFT JOIN live l USING (topic) LEFT JOIN dead d USING (topic), clock
ORDER BY k.topic
"""

#: Ready and delayed items of one topic (the leased ones left out), counted up to a limit:
#: a backlog check reads at most ``limit`` rows however long the topic is.
WAITING = f"""
SELECT count(*) FROM (
    SELECT 1 FROM {ITEMS}
    WHERE namespace = %(ns)s AND topic = %(topic)s
      AND (lease_owner IS NULL OR deliver_after <= {NOW})
    LIMIT %(limit)s
) w
"""

DEAD_ITEMS = f"""
SELECT id, priority, payload, headers, attempts, enqueued_ms, reason, error, dead_ms
FROM {DEAD} WHERE namespace = %s AND topic = %s
ORDER BY dead_ms, id LIMIT %s
"""

#: A replayed item's headers: its own, and ``asynctier.replayed`` (when it died, which
#: tells one replay from the next) in place of an earlier replay's: its run starts a trace
#: of its own, linked to the item's first (:mod:`asynctier.platform.tracing`).
REPLAYED_HEADERS = """(
    SELECT COALESCE(jsonb_agg(h), '[]'::jsonb)
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(m.headers) = 'array' THEN m.headers
                                   ELSE '[]'::jsonb END) h
    WHERE h->>0 <> 'asynctier.replayed'
) || jsonb_build_array(jsonb_build_array('asynctier.replayed',
                                         encode(convert_to(m.dead_ms::text, 'UTF8'), 'base64')))"""

REPLAY = f"""
WITH pick AS (
    SELECT d.id FROM {DEAD} d
    WHERE d.namespace = %(ns)s AND d.topic = %(topic)s
      AND (%(ids)s::text[] IS NULL OR d.id = ANY(%(ids)s::text[]))
      AND NOT EXISTS (SELECT 1 FROM {ITEMS} i
                      WHERE i.namespace = d.namespace AND i.topic = d.topic AND i.id = d.id)
    ORDER BY d.dead_ms, d.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {DEAD} d USING pick p
    WHERE d.namespace = %(ns)s AND d.topic = %(topic)s
      AND d.id = ANY(ARRAY(SELECT id FROM pick)) AND d.id = p.id
    RETURNING d.*
), waits AS (  -- a replayed child waits for its parents not acked yet
    SELECT m.id, (SELECT count(*) FROM {EDGES} e WHERE e.namespace = %(ns)s
                  AND e.child_topic = %(topic)s AND e.child_id = m.id)::int AS n
    FROM moved m
)
INSERT INTO {ITEMS} (namespace, topic, id, priority, deliver_after, payload, headers,
                     attempts, enqueued_ms, last_error, waiting_on, release_after,
                     on_parent_failure, parents)
SELECT namespace, topic, m.id, priority, CASE WHEN w.n > 0 THEN {WAITING_MS} ELSE {NOW} END,
       payload, {REPLAYED_HEADERS}, 0, enqueued_ms, error, w.n, {NOW}, on_parent_failure,
       parents
FROM moved m JOIN waits w ON w.id = m.id ORDER BY dead_ms, m.id
ON CONFLICT DO NOTHING
RETURNING id
"""

#: Save one leased item's checkpoint (only while ``owner`` holds it); a checkpoint is a
#: heartbeat too, so the lease is extended from now.
CHECKPOINT = f"""
UPDATE {ITEMS}
SET checkpoint = %(state)s, checkpoint_kind = %(kind)s, checkpoint_ms = {NOW},
    heartbeat_ms = {NOW}, lease_expires = {NOW} + %(lease_ms)s,
    deliver_after = {NOW} + %(lease_ms)s
WHERE namespace = %(ns)s AND topic = %(topic)s AND id = %(id)s AND lease_owner = %(owner)s
RETURNING id
"""

#: The items running now (leased) of a namespace's topics, the longest running first.
#: A delayed item (not leased, not waiting for parents, due later) made due now.
RUN_NOW = f"""
UPDATE {ITEMS} SET deliver_after = {NOW}
WHERE namespace = %(ns)s AND topic = %(topic)s AND id = %(id)s
  AND lease_owner IS NULL AND waiting_on = 0 AND deliver_after > {NOW}
RETURNING id
"""

#: One page of a topic's live items in one state, in the order the lease takes them
#: (priority, then due time: the lease index); at most 200 bytes of each payload.
BROWSE = f"""
WITH clock AS (SELECT {NOW} AS ms)
SELECT id, priority, attempts, enqueued_ms, deliver_after, lease_owner, waiting_on,
       substring(payload from 1 for 200)
FROM {ITEMS}, clock
WHERE namespace = %(ns)s AND topic = %(topic)s
  AND CASE %(state)s
        WHEN 'ready' THEN deliver_after <= clock.ms
        WHEN 'delayed' THEN deliver_after > clock.ms AND lease_owner IS NULL
                            AND waiting_on = 0
        WHEN 'leased' THEN deliver_after > clock.ms AND lease_owner IS NOT NULL
        WHEN 'waiting' THEN waiting_on > 0
      END
ORDER BY priority DESC, deliver_after, seq
LIMIT %(limit)s OFFSET %(offset)s
"""

RUNNING = f"""
SELECT topic, id, attempts, lease_owner, {NOW} - leased_ms, {NOW} - heartbeat_ms,
       {NOW} - checkpoint_ms, octet_length(checkpoint)
FROM {ITEMS}
WHERE namespace = %(ns)s AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND lease_owner IS NOT NULL AND deliver_after > {NOW}
ORDER BY leased_ms, id
LIMIT %(limit)s
"""

TOPICS_ALL = f"SELECT namespace, topic FROM {TOPICS} ORDER BY namespace, topic"
