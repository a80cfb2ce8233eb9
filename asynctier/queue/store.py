"""One queue shard: a PostgreSQL database holding items, leases and dead items.

Every operation is batched: one statement (or one pipelined transaction, for
``resolve``) per call, whatever the number of items. Leases are non-blocking (``FOR UPDATE
SKIP LOCKED``): many owners lease from one topic and never get the same item at once.

An item is *ready* when its ``deliver_after`` has passed; leasing it sets
``deliver_after`` to the lease's expiry, so an item whose lease ran out is ready again by
itself (and its next lease counts as an attempt). Acked items are deleted in the resolve
transaction; the table's autovacuum settings (migration 0001) keep its dead tuples
bounded.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from asynctier.platform.errors import QueueError, QueueUnavailable
from asynctier.platform.wire import UNDECODABLE
from asynctier.queue import deps, sql
from asynctier.queue.dsn import redact_dsn
from asynctier.queue.items import (
    CHECKPOINT_KINDS,
    LIVE_STATES,
    MAX_LEASE_BATCH,
    Dead,
    DeadItem,
    EnqueueResult,
    Header,
    ItemInfo,
    Leased,
    Listed,
    Nack,
    NewItem,
    Resolved,
    Running,
    State,
    TopicCounts,
    check_id,
    check_namespace,
    check_new_item,
    check_seconds,
    check_topic,
    new_item_id,
)
from asynctier.queue.migrate import migrate
from asynctier.queue.wakeups import notify_key

log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]
#: How long an operation waits for a connection before saying the shard is down.
DEFAULT_TIMEOUT_S = 5.0
#: The most lease statements one ``lease`` call runs (each after one that moved items to
#: the dead items instead of leasing them).
LEASE_ROUNDS = 4
#: Batches of this many items or more (without parents) are written by ``COPY``; below
#: it the one ``INSERT`` statement costs fewer round trips than ``COPY`` does.
COPY_FROM = 100


class QueueStore:
    """The queue on ONE PostgreSQL database (a shard), through a pool of connections.

    Nothing connects at construction: the pool connects in the background and the
    migrations run before the first operation. When PostgreSQL is down an operation
    raises :class:`QueueUnavailable` naming the shard, after at most ``timeout_s``; the
    pool reconnects by itself when it is back.
    """

    def __init__(self, dsn: str, pool_size: int = 4,
                 timeout_s: float = DEFAULT_TIMEOUT_S, name: str | None = None) -> None:
        self.dsn = dsn
        self.name = name or redact_dsn(dsn)  # a shard's name: its first host's address
        self.timeout_s = timeout_s
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, open=True, timeout=timeout_s,
            check=ConnectionPool.check_connection, name=self.name,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s)),
                    "application_name": "asynctier-queue"},
        )
        self._migrated = False
        self._migrate_lock = threading.Lock()

    def close(self) -> None:
        """Close every connection."""
        self._pool.close()

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"QueueStore({self.name!r})"

    # ----------------------------------------------------------------- connections

    @contextmanager
    def _conn(self) -> Iterator[Conn]:
        """A pooled connection; a connection failure becomes QueueUnavailable."""
        try:
            with self._pool.connection() as conn:
                if not self._migrated:
                    self._migrate(conn)
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise QueueUnavailable(
                f"queue shard {self.name} is unavailable ({_first_line(exc)}): is its "
                f"PostgreSQL running? Operations work again once it answers") from exc

    def _migrate(self, conn: Conn) -> None:
        with self._migrate_lock:
            if not self._migrated:
                applied = migrate(conn)
                if applied:
                    log.info("queue shard %s: applied migrations %s", self.name, applied)
                self._migrated = True

    def migrate(self) -> None:
        """Apply the schema's migrations now (done before the first operation anyway)."""
        with self._conn():
            pass

    # ----------------------------------------------------------------- producing

    def enqueue(self, namespace: str, items: Sequence[NewItem]) -> list[EnqueueResult]:
        """Add items (one statement); an id already there is left as it is and reported
        ``created=False``. Every item is checked first: one bad item refuses the call."""
        with self._conn() as conn:
            return enqueue_in(conn, namespace, items)

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """A connection inside one transaction, for a room that writes its own rows beside
        items in the same commit (a schedule's advance and its tick's item); pass it to
        :func:`enqueue_in`."""
        with self._conn() as conn, conn.transaction():
            yield conn

    # ----------------------------------------------------------------- consuming

    def lease(self, namespace: str, topic: str, n: int, lease_s: float, owner: str,
              max_attempts: int | None = None) -> list[Leased]:
        """Lease up to ``n`` ready items for ``lease_s`` seconds, highest priority first,
        then earliest ``deliver_after``, then enqueue order; items leased by others are
        skipped. With ``max_attempts``, an item that has had that many attempts (its last
        lease ran out) goes to the dead items instead, as does one whose time to live ran
        out; the lease then looks again for the rest (at most :data:`LEASE_ROUNDS`
        statements in all)."""
        _check_topic_args(namespace, topic)
        if not isinstance(n, int) or not 1 <= n <= MAX_LEASE_BATCH:
            raise QueueError(f"lease of {n!r} items from {topic!r}: ask for 1 to "
                             f"{MAX_LEASE_BATCH} at a time")
        _check_lease(lease_s, topic)
        if max_attempts is not None and max_attempts < 1:
            raise QueueError(f"max_attempts={max_attempts} for {topic!r}: give 1 or more "
                             "(or None for no limit)")
        params: dict[str, Any] = {"ns": namespace, "topic": topic, "owner": owner,
                                  "lease_ms": round(lease_s * 1000),
                                  "max_attempts": max_attempts}
        rows: list[tuple[Any, ...]] = []
        doomed: list[str] = []
        with self._conn() as conn:
            for _ in range(LEASE_ROUNDS):
                got = conn.execute(sql.LEASE, {**params, "n": n - len(rows)}).fetchall()
                leased = [r for r in got if r[0] is not None]
                doomed += [r[11] for r in got if r[0] is None]
                rows += leased
                if len(leased) == len(got) or len(rows) >= n:
                    break  # nothing was buried: no more ready items, or enough
            if doomed:  # their waiting children die with them (or run)
                deps.propagate(conn, namespace, topic, doomed)
        rows.sort(key=lambda r: (-r[3], r[6], r[8]))
        good: list[Leased] = []
        bad: list[Dead] = []
        for r in rows:
            try:
                good.append(_leased(namespace, topic, r))
            except ValueError as exc:
                bad.append(Dead(r[0], UNDECODABLE, f"its stored row is refused: {exc}"))
        if bad:
            self._bury_unreadable(namespace, topic, owner, bad)
        return good

    def _bury_unreadable(self, namespace: str, topic: str, owner: str,
                         bad: list[Dead]) -> None:
        """Leased items whose stored headers or checkpoint cannot be what the platform wrote
        (something else wrote the row) go to the dead items, never to a function."""
        for dead in bad:
            log.error("queue %s/%s: item %r %s; it is moved to the dead items (`asynctier "
                      "queue dead %s` shows it)", namespace, topic, dead.id, dead.error, topic)
        self.resolve(namespace, topic, owner, deads=bad)

    def resolve(self, namespace: str, topic: str, owner: str, acks: Sequence[str] = (),
                nacks: Sequence[Nack] = (), deads: Sequence[Dead] = ()) -> Resolved:
        """Apply a batch's outcomes in one transaction: acks delete, nacks make the item
        ready again after their delay (the attempt given back when ``spend_attempt`` is
        False), deads move it to the dead items. Only items ``owner`` still leases are
        touched; the others are listed in ``not_held``."""
        _check_topic_args(namespace, topic)
        wanted = [*acks, *(n.id for n in nacks), *(d.id for d in deads)]
        _check_distinct(wanted, topic)
        for nack in nacks:
            check_seconds(nack.delay_s, "delay_s", f"nack of {nack.id!r} in {topic!r}: ")
        if not wanted:
            return Resolved()
        base = {"ns": namespace, "topic": topic, "owner": owner}
        statements: list[tuple[str, dict[str, Any]]] = []
        if acks:
            statements.append((sql.ACK, {**base, "ids": list(acks)}))
        if nacks:
            statements.append((sql.NACK, {**base, "ids": [n.id for n in nacks],
                                          "delay_ms": [round(n.delay_s * 1000) for n in nacks],
                                          "spend": [n.spend_attempt for n in nacks],
                                          "errors": [_text(n.error) for n in nacks]}))
        if deads:
            statements.append((sql.BURY, {**base, "ids": [d.id for d in deads],
                                          "reasons": [_text(d.reason) for d in deads],
                                          "errors": [_text(d.error) for d in deads]}))
        # Each after the statements it follows, to see their effects (queue/deps.py).
        release_at = len(statements)  # its rows: (child topic, released) of each child
        if acks:
            statements.append((deps.RELEASE, {"ns": namespace, "topic": topic,
                                              "ids": list(acks)}))
        if deads:
            statements.append((deps.PROPAGATE, {"ns": namespace, "topic": topic,
                                                "ids": [d.id for d in deads]}))
        with self._conn() as conn:
            with conn.pipeline(), conn.transaction():
                cursors = [conn.execute(query, params) for query, params in statements]
            rows = [cursor.fetchall() for cursor in cursors]
            if acks:  # the topics of the children the acks released: their tailers wake
                woken = sorted({child for child, released in rows[release_at] if released})
                if woken:
                    conn.execute(sql.NOTIFY_READY,
                                 {"keys": [notify_key(namespace, t) for t in woken]})
        done = [{row[0] for row in found} for found in rows]
        counts = iter(done)
        acked = next(counts) if acks else set()
        nacked = next(counts) if nacks else set()
        buried = next(counts) if deads else set()
        held = acked | nacked | buried
        return Resolved(acked=len(acked), nacked=len(nacked), dead=len(buried),
                        not_held=tuple(i for i in wanted if i not in held))

    def extend_lease(self, namespace: str, topic: str, owner: str, ids: Sequence[str],
                     lease_s: float) -> list[str]:
        """Lease these items for ``lease_s`` more seconds from now; returns the ids
        ``owner`` still held (and so extended)."""
        _check_topic_args(namespace, topic)
        _check_lease(lease_s, topic)
        if not ids:
            return []
        params = {"ns": namespace, "topic": topic, "owner": owner, "ids": list(ids),
                  "lease_ms": round(lease_s * 1000)}
        with self._conn() as conn:
            held = {row[0] for row in conn.execute(sql.EXTEND, params).fetchall()}
        return [i for i in ids if i in held]

    def save_checkpoint(self, namespace: str, topic: str, owner: str, item_id: str,
                        state: bytes, kind: str, lease_s: float) -> bool:
        """Store a leased item's checkpoint (durable on return) and extend its lease by
        ``lease_s`` from now; False when ``owner`` no longer holds the item (nothing
        written)."""
        _check_topic_args(namespace, topic)
        _check_lease(lease_s, topic)
        if kind not in CHECKPOINT_KINDS:
            raise QueueError(f"checkpoint of {item_id!r} in {topic!r}: kind {kind!r} is not "
                             f"one of {', '.join(CHECKPOINT_KINDS)}")
        params = {"ns": namespace, "topic": topic, "owner": owner, "id": item_id,
                  "state": state, "kind": kind, "lease_ms": round(lease_s * 1000)}
        with self._conn() as conn:
            return conn.execute(sql.CHECKPOINT, params).fetchone() is not None

    def running(self, namespace: str, topic: str | None = None,
                limit: int = 20) -> list[Running]:
        """The items leased now (of ``topic``, or of every topic of ``namespace``), the
        longest running first, at most ``limit``."""
        check_namespace(namespace)
        if topic is not None:
            check_topic(topic)
        with self._conn() as conn:
            rows = conn.execute(sql.RUNNING, {"ns": namespace, "topic": topic,
                                              "limit": limit}).fetchall()
        return [Running(topic=r[0], id=r[1], attempt=r[2], owner=r[3],
                        age_s=_seconds(r[4]) or 0.0, heartbeat_age_s=_seconds(r[5]),
                        checkpoint_age_s=_seconds(r[6]), checkpoint_bytes=r[7])
                for r in rows]

    # ----------------------------------------------------------------- looking

    def get(self, namespace: str, topic: str, item_id: str) -> ItemInfo | None:
        """One item in whatever state it is (dead too), or None."""
        _check_topic_args(namespace, topic)
        with self._conn() as conn:
            live = conn.execute(sql.GET_LIVE, (namespace, topic, item_id)).fetchone()
            dead = None if live else conn.execute(
                sql.GET_DEAD, (namespace, topic, item_id)).fetchone()
            parents = live[-2] if live else dead[-1] if dead else None
            family = self._family(conn, namespace, topic, item_id, parents) \
                if live or dead else None
        if live is not None:
            return dataclasses.replace(_live_info(namespace, topic, live), **(family or {}))
        if dead is not None:
            d = _dead_item(namespace, topic, dead[:9])
            return ItemInfo(id=d.id, namespace=namespace, topic=topic, state="dead",
                            priority=d.priority, payload=d.payload, headers=d.headers,
                            attempts=d.attempts, enqueued_ms=d.enqueued_ms, reason=d.reason,
                            last_error=d.error, dead_ms=d.dead_ms, **(family or {}))
        return None

    def _family(self, conn: Conn, namespace: str, topic: str, item_id: str,
                parents_doc: Any, limit: int = 100) -> dict[str, Any]:
        """An item's parents with their states, and its waiting children (up to
        ``limit``), for ``get``."""
        refs = _parent_refs(parents_doc)
        states = conn.execute(deps.PARENT_STATES, {
            "ns": namespace, "topics": [t for t, _ in refs],
            "ids": [i for _, i in refs]}).fetchall() if refs else []
        children = conn.execute(deps.CHILDREN, (namespace, topic, item_id, limit)).fetchall()
        return {"parents": tuple((r[0], r[1], r[2]) for r in states),
                "children": tuple((r[0], r[1]) for r in children)}

    def cancel(self, namespace: str, topic: str, item_id: str) -> bool:
        """Delete one item, live or dead (a leased one too: its owner's resolve then finds
        it not held); True when there was one."""
        _check_topic_args(namespace, topic)
        with self._conn() as conn:
            row = conn.execute(deps.CANCEL, {"ns": namespace, "topic": topic,
                                             "id": item_id}).fetchone()
        if row and row[1] > row[0]:
            log.info("queue %s/%s: cancelling %r cancelled %d of its descendants", namespace,
                     topic, item_id, row[1] - row[0])
        return bool(row and row[0])

    def browse(self, namespace: str, topic: str, state: str, limit: int = 100,
               offset: int = 0) -> list[Listed]:
        """One page of ``topic``'s items in ``state`` (one of :data:`LIVE_STATES`), in
        the order the lease takes them: highest priority first, then the earliest due."""
        _check_topic_args(namespace, topic)
        if state not in LIVE_STATES:
            raise QueueError(f"state {state!r}: give one of {', '.join(LIVE_STATES)}")
        with self._conn() as conn:
            rows = conn.execute(sql.BROWSE, {"ns": namespace, "topic": topic, "state": state,
                                             "limit": limit, "offset": offset}).fetchall()
        return [Listed(id=r[0], priority=r[1], attempts=r[2], enqueued_ms=r[3],
                       deliver_after_ms=None if r[6] > 0 else r[4], lease_owner=r[5],
                       head=bytes(r[7] or b"")) for r in rows]

    def run_now(self, namespace: str, topic: str, item_id: str) -> bool:
        """Make a delayed item (a retry's backoff, a deliver-after) due now; True when
        there was one. A ready, leased, waiting or dead item is left as it is."""
        _check_topic_args(namespace, topic)
        with self._conn() as conn:
            row = conn.execute(sql.RUN_NOW, {"ns": namespace, "topic": topic,
                                             "id": item_id}).fetchone()
        return row is not None

    def counts(self, namespace: str, topic: str | None = None) -> list[TopicCounts]:
        """Ready, delayed, leased and dead items and the oldest ready item's age, per
        topic of ``namespace`` (or of ``topic`` alone). Reads every item of the topics:
        for dashboards and the CLI, not for each batch."""
        check_namespace(namespace)
        if topic is not None:
            check_topic(topic)
        with self._conn() as conn:
            rows = conn.execute(sql.COUNTS, {"ns": namespace, "topic": topic}).fetchall()
        return [TopicCounts(namespace, r[0], r[1], r[2], r[3], r[4], float(r[5]), r[6])
                for r in rows]

    def waiting(self, namespace: str, topic: str, limit: int) -> int:
        """Ready and delayed items of ``topic`` (``counts``' ready + delayed), but
        ``limit`` at most: reads at most ``limit`` items, however many there are."""
        _check_topic_args(namespace, topic)
        with self._conn() as conn:
            row = conn.execute(sql.WAITING, {"ns": namespace, "topic": topic,
                                             "limit": limit}).fetchone()
        return int(row[0]) if row else 0

    def dead_items(self, namespace: str, topic: str, limit: int = 100) -> list[DeadItem]:
        """The dead items of a topic, oldest death first."""
        _check_topic_args(namespace, topic)
        with self._conn() as conn:
            rows = conn.execute(sql.DEAD_ITEMS, (namespace, topic, limit)).fetchall()
        return [_dead_item(namespace, topic, r) for r in rows]

    def replay(self, namespace: str, topic: str, limit: int | None = None,
               ids: Sequence[str] | None = None) -> int:
        """Move dead items back to ready, attempts reset, oldest death first (only
        ``ids`` when given); returns how many. A dead item whose id is live again (it was
        enqueued anew) stays dead."""
        _check_topic_args(namespace, topic)
        params = {"ns": namespace, "topic": topic, "limit": limit,
                  "ids": None if ids is None else list(ids)}
        with self._conn() as conn, conn.transaction():
            replayed = [r[0] for r in conn.execute(sql.REPLAY, params).fetchall()]
            if replayed:  # their children that died with them come back, waiting again
                deps.replay_children(conn, namespace, topic, replayed)
        return len(replayed)

    def topics(self) -> list[tuple[str, str]]:
        """Every (namespace, topic) this shard has had items for."""
        with self._conn() as conn:
            return [(r[0], r[1]) for r in conn.execute(sql.TOPICS_ALL).fetchall()]


# --------------------------------------------------------------------------- helpers


def enqueue_in(conn: Conn, namespace: str, items: Sequence[NewItem]) -> list[EnqueueResult]:
    """:meth:`QueueStore.enqueue` on ``conn`` (inside the caller's transaction, if any)."""
    check_namespace(namespace)
    for position, item in enumerate(items):
        check_new_item(item, position)
    if not items:
        return []
    ids = [item.id or new_item_id() for item in items]
    if any(item.after for item in items):
        with conn.transaction():  # the children, their parents checked, and their edges
            created = _inserted(conn, namespace, items, ids)
            deps.hold_children(conn, namespace, items, ids, set(created))
    elif len(items) >= COPY_FROM and _copied(conn, namespace, items, ids):
        created = {(item.topic, item_id) for item, item_id in zip(items, ids, strict=True)}
    else:
        created = _inserted(conn, namespace, items, ids)
    results = []
    ready: set[str] = set()  # the topics with new items ready now: their tailers are woken
    for item, item_id in zip(items, ids, strict=True):
        key = (item.topic, item_id)
        results.append(EnqueueResult(item_id, key in created))
        if key in created and not item.after and not item.delay_s and (
                item.deliver_after_ms is None):
            ready.add(item.topic)
        created.discard(key)  # the same id twice in one batch: only the first is new
    if ready:
        conn.execute(sql.NOTIFY_READY,
                     {"keys": [notify_key(namespace, topic) for topic in sorted(ready)]})
    return results


def _inserted(conn: Conn, namespace: str, items: Sequence[NewItem],
              ids: list[str]) -> set[tuple[str, str]]:
    """Write items by the one statement that leaves existing ids as they are; the
    (topic, id) of those it created."""
    params = {
        "ns": namespace, "ids": ids, "topics": [i.topic for i in items],
        "priorities": [i.priority for i in items],
        "after": [i.deliver_after_ms for i in items],
        "payloads": [bytes(i.payload) for i in items],
        "headers": [encode_headers(i.headers) for i in items],
        "ttl_ms": [None if i.ttl_s is None else round(i.ttl_s * 1000) for i in items],
        "delay_ms": [None if i.delay_s is None else round(i.delay_s * 1000) for i in items],
    }
    return {(t, i) for t, i in conn.execute(sql.ENQUEUE, params).fetchall()}


def _copied(conn: Conn, namespace: str, items: Sequence[NewItem], ids: list[str]) -> bool:
    """Write a batch of items without parents by a binary ``COPY``, PostgreSQL's cheapest
    write; False, with nothing written, when one of the ids is there already (a ``COPY``
    cannot skip a row, so it fails whole): the caller then writes the batch with the
    statement that leaves existing ids as they are."""
    try:
        with conn.transaction():
            topics = sorted({item.topic for item in items})
            [(now,)] = conn.execute(sql.SEEN_NOW, {"ns": namespace, "topics": topics}).fetchall()
            with conn.cursor().copy(sql.COPY_ITEMS) as copy:
                copy.set_types(sql.COPY_TYPES)
                for item, item_id in zip(items, ids, strict=True):
                    doc = headers_doc(item.headers)
                    copy.write_row((
                        namespace, item.topic, item_id, item.priority,
                        _deliver_after(item, now), bytes(item.payload),
                        None if doc is None else Jsonb(doc), now,
                        None if item.ttl_s is None else now + round(item.ttl_s * 1000)))
        return True
    except psycopg.errors.UniqueViolation:
        return False


def _deliver_after(item: NewItem, now_ms: int) -> int:
    """When an item without parents is first ready, by the database's time ``now_ms``."""
    if item.deliver_after_ms is not None:
        return item.deliver_after_ms
    if item.delay_s is not None:
        return now_ms + round(item.delay_s * 1000)
    return now_ms


def headers_doc(headers: Sequence[Header]) -> list[list[str | None]] | None:
    """Headers as the stored document ``[[name, base64 or null], ...]``; None when there
    are none."""
    if not headers:
        return None
    return [[name, None if value is None else base64.b64encode(value).decode()]
            for name, value in headers]


def encode_headers(headers: Sequence[Header]) -> str | None:
    """:func:`headers_doc` as JSON text."""
    doc = headers_doc(headers)
    return None if doc is None else json.dumps(doc)


def decode_headers(doc: Any) -> tuple[Header, ...]:
    """The stored headers back as (name, bytes or None) pairs; ValueError, saying what is
    wrong, when the stored document is not what :func:`encode_headers` writes."""
    if not doc:
        return ()
    if not isinstance(doc, list):
        raise ValueError(f"headers {str(doc)[:80]!r} are not a list")
    out = []
    for pair in doc:
        if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str)
                or not (pair[1] is None or isinstance(pair[1], str))):
            raise ValueError(f"header {str(pair)[:80]!r} is not [name, base64 or null]")
        try:
            value = None if pair[1] is None else base64.b64decode(pair[1], validate=True)
        except binascii.Error:
            raise ValueError(f"header {pair[0][:40]!r} is not base64") from None
        out.append((pair[0], value))
    return tuple(out)


def _shown_headers(doc: Any) -> tuple[Header, ...]:
    """Headers for inspection (``get``, the dead items): stored headers that cannot be read
    show as none, so that one bad row does not hide the others."""
    try:
        return decode_headers(doc)
    except ValueError:
        return ()


def _leased(namespace: str, topic: str, r: tuple[Any, ...]) -> Leased:
    """A leased row (``sql.LEASE``'s columns) as a :class:`Leased`; ValueError when its
    headers or checkpoint kind are not what the platform writes."""
    kind = r[11]
    if r[10] is not None and kind not in CHECKPOINT_KINDS:
        raise ValueError(f"checkpoint kind {str(kind)[:40]!r} is not one of "
                         f"{', '.join(CHECKPOINT_KINDS)}")
    return Leased(id=r[0], namespace=namespace, topic=topic, payload=r[1],
                  headers=decode_headers(r[2]), priority=r[3], attempt=r[4],
                  enqueued_ms=r[5], deliver_after_ms=r[6], lease_expires_ms=r[7],
                  lease_ran_out=bool(r[9]),
                  checkpoint=None if r[10] is None else bytes(r[10]), checkpoint_kind=kind)


def _parent_refs(doc: Any) -> list[tuple[str, str]]:
    """The stored parents ``[[topic, id], ...]``; a stored value that is not that shows as
    none (``get`` is for inspection: one bad row does not hide the rest)."""
    if not isinstance(doc, list):
        return []
    return [(p[0], p[1]) for p in doc if isinstance(p, list) and len(p) == 2
            and all(isinstance(x, str) for x in p)]


def _live_info(namespace: str, topic: str, r: tuple[Any, ...]) -> ItemInfo:
    (item_id, priority, payload, headers, attempts, enqueued_ms, deliver_after, owner,
     lease_expires, expires_ms, last_error, now_ms, leased_ms, heartbeat_ms, checkpoint_bytes,
     checkpoint_ms, waiting_on, _parents, released_ms) = r
    state: State = "ready"
    if waiting_on > 0:
        state = "waiting"
    elif deliver_after > now_ms:
        state = "leased" if owner is not None else "delayed"
    return ItemInfo(id=item_id, namespace=namespace, topic=topic, state=state,
                    priority=priority, payload=payload, headers=_shown_headers(headers),
                    attempts=attempts, enqueued_ms=enqueued_ms,
                    deliver_after_ms=None if waiting_on > 0 else deliver_after,
                    lease_owner=owner, lease_expires_ms=lease_expires, expires_ms=expires_ms,
                    last_error=last_error, leased_ms=leased_ms if owner else None,
                    heartbeat_ms=heartbeat_ms if owner else None,
                    checkpoint_bytes=checkpoint_bytes, checkpoint_ms=checkpoint_ms,
                    waiting_on=waiting_on, released_ms=released_ms)


def _dead_item(namespace: str, topic: str, r: tuple[Any, ...]) -> DeadItem:
    item_id, priority, payload, headers, attempts, enqueued_ms, reason, error, dead_ms = r
    return DeadItem(id=item_id, namespace=namespace, topic=topic, priority=priority,
                    payload=payload, headers=_shown_headers(headers), attempts=attempts,
                    enqueued_ms=enqueued_ms, reason=reason, error=error, dead_ms=dead_ms)


def _check_topic_args(namespace: str, topic: str) -> None:
    check_namespace(namespace)
    check_topic(topic)


def _check_lease(lease_s: float, topic: str) -> None:
    check_seconds(lease_s, "lease_s", f"lease on {topic!r}: ")
    if lease_s < 0.001:
        raise QueueError(f"lease on {topic!r}: lease_s={lease_s!r} is too short; give at "
                         "least 1 ms (usually seconds: the time a batch may take)")


def _check_distinct(ids: Sequence[str], topic: str) -> None:
    for item_id in ids:
        check_id(item_id, f"resolve in {topic!r}: ")
    if len(set(ids)) != len(ids):
        twice = sorted(i for i, count in Counter(ids).items() if count > 1)
        raise QueueError(f"resolve in {topic!r}: ids {twice[:5]} appear more than once among "
                         "the acks, nacks and deads; give each item one outcome")


def _text(text: str) -> str:
    """An error or reason as PostgreSQL text stores it (no NUL characters)."""
    return text.replace("\x00", "\ufffd")


def _seconds(ms: int | None) -> float | None:
    """Milliseconds (or None) as seconds."""
    return None if ms is None else ms / 1000.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
