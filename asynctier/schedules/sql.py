"""The schedule store's statements (table: migration ``0003_schedules.sql``).

Time is the database's (``asynctier_queue_now_ms()``), as for the queue: a process whose own
clock is wrong neither fires early nor late.
"""

from __future__ import annotations

TABLE = "asynctier_schedules"
NOW = "asynctier_queue_now_ms()"

#: The columns a :class:`~asynctier.schedules.store.ScheduleInfo` is read from, in order.
COLUMNS = ("namespace, name, topic, cron, every_s, timezone, payload, priority, expire_s, "
           "catch_up, catch_up_max, grace_s, version, paused, next_ms, last_tick_ms, "
           "last_fired_ms, last_lateness_ms, fired, skipped, error, target")

CLOCK = f"SELECT {NOW}"

INSERT = f"""
INSERT INTO {TABLE} (namespace, name, topic, cron, every_s, timezone, payload, priority,
                     expire_s, catch_up, catch_up_max, grace_s, next_ms, target)
VALUES (%(namespace)s, %(name)s, %(topic)s, %(cron)s, %(every_s)s, %(timezone)s, %(payload)s,
        %(priority)s, %(expire_s)s, %(catch_up)s, %(catch_up_max)s, %(grace_s)s, %(next_ms)s,
        %(target)s)
ON CONFLICT DO NOTHING
RETURNING name
"""

#: Replace a schedule's definition (a new version): its next tick is computed anew, the
#: row lock waits for a firing under way, so the old version fires no tick after this.
REPLACE = f"""
UPDATE {TABLE} SET topic = %(topic)s, cron = %(cron)s, every_s = %(every_s)s,
    timezone = %(timezone)s, payload = %(payload)s, priority = %(priority)s,
    expire_s = %(expire_s)s, catch_up = %(catch_up)s, catch_up_max = %(catch_up_max)s,
    grace_s = %(grace_s)s, next_ms = %(next_ms)s, target = %(target)s,
    version = version + 1, error = '',
    updated_ms = {NOW}
WHERE namespace = %(namespace)s AND name = %(name)s
RETURNING version
"""

GET = f"SELECT {COLUMNS}, {NOW} FROM {TABLE} WHERE namespace = %s AND name = %s"
GET_LOCKED = f"SELECT {COLUMNS}, {NOW} FROM {TABLE} WHERE namespace = %s AND name = %s FOR UPDATE"
LIST = f"SELECT {COLUMNS}, {NOW} FROM {TABLE} WHERE namespace = %s ORDER BY name"
DELETE = f"DELETE FROM {TABLE} WHERE namespace = %s AND name = %s RETURNING name"

PAUSE = f"""
UPDATE {TABLE} SET paused = true, version = version + 1, updated_ms = {NOW}
WHERE namespace = %s AND name = %s RETURNING name
"""

RESUME = f"""
UPDATE {TABLE} SET paused = false, next_ms = %(next_ms)s, version = version + 1, error = '',
    updated_ms = {NOW}
WHERE namespace = %(namespace)s AND name = %(name)s RETURNING name
"""

#: The due schedules of every namespace, locked for this firing; the ones another
#: process is firing now are skipped (it fires them).
DUE = f"""
SELECT {COLUMNS}, {NOW} FROM {TABLE}
WHERE NOT paused AND next_ms <= {NOW}
  AND (%(namespaces)s::text[] IS NULL OR namespace = ANY(%(namespaces)s::text[]))
ORDER BY next_ms
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

#: The schedules fired (their rows locked by DUE in the same transaction) moved on.
ADVANCE = f"""
UPDATE {TABLE} s
SET next_ms = a.next_ms, last_tick_ms = COALESCE(a.last_tick_ms, s.last_tick_ms),
    last_fired_ms = CASE WHEN a.last_tick_ms IS NULL THEN s.last_fired_ms ELSE {NOW} END,
    last_lateness_ms = COALESCE(a.lateness_ms, s.last_lateness_ms),
    fired = s.fired + a.fired, skipped = s.skipped + a.skipped
FROM unnest(%(namespaces)s::text[], %(names)s::text[], %(next_ms)s::bigint[],
            %(last_tick_ms)s::bigint[], %(lateness_ms)s::bigint[], %(fired)s::int[],
            %(skipped)s::int[])
     AS a(namespace, name, next_ms, last_tick_ms, lateness_ms, fired, skipped)
WHERE s.namespace = a.namespace AND s.name = a.name
"""

#: A schedule whose stored row cannot be read (something else wrote it) is paused with
#: why, so that the firing does not meet it again every round.
BREAK = f"""
UPDATE {TABLE} SET paused = true, error = %(error)s, updated_ms = {NOW}
WHERE namespace = %(namespace)s AND name = %(name)s
"""

#: The earliest tick of any active schedule: how long the loop may sleep.
NEXT_DUE = f"""
SELECT min(next_ms), {NOW} FROM {TABLE}
WHERE NOT paused AND (%(namespaces)s::text[] IS NULL OR namespace = ANY(%(namespaces)s::text[]))
"""
