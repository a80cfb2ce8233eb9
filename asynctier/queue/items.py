"""The values the queue store takes and gives, and the checks on what producers send.

Every check raises :class:`QueueError` naming the item (its topic and id, or its place in
the batch) and saying what to fix.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from asynctier.platform.errors import QueueError
from asynctier.platform.tracing import trace_id_of

#: Priorities run from -1000 (last) to 1000 (first); 0 is the default.
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
#: The largest payload an item may carry (1 MiB): a queue item is a unit of work, not a
#: blob store; put big inputs elsewhere and enqueue their address.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: Ids are 1 to 200 printable characters.
MAX_ID_CHARS = 200
#: The most items one ``lease`` call may ask for.
MAX_LEASE_BATCH = 10_000
#: The longest delay or lease (365 days), in seconds.
MAX_DELAY_S = 365 * 86400.0
#: How a checkpoint's bytes are to be read back: JSON text, or the bytes as saved.
CHECKPOINT_KINDS = ("json", "bytes")

# The same rules as Kafka topic names and binding tenants (asynctier.platform.binding).
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

State = Literal["ready", "delayed", "leased", "waiting", "dead"]
Header = tuple[str, bytes | None]
#: A parent of an item: (topic, id) in the item's namespace.
ParentRef = tuple[str, str]
#: What a waiting item does when a parent dies: die too (``parent_failed``), or run.
ON_PARENT_FAILURE = ("fail", "run")


@dataclass(frozen=True)
class NewItem:
    """An item to enqueue. ``id=None``: the store makes one; ``deliver_after_ms=None``:
    ready now, or ``delay_s`` after its enqueue by the database's clock when given;
    ``ttl_s``: dropped to the dead items (reason ``expired``) when not leased within that
    many seconds of its enqueue. ``after``: the parents it waits for (see
    :mod:`asynctier.queue.deps`); ``on_parent_failure``: ``fail`` (die with a parent) or
    ``run`` (run once every parent has ended, whatever the end)."""

    topic: str
    payload: bytes
    id: str | None = None
    priority: int = 0
    deliver_after_ms: int | None = None
    headers: Sequence[Header] = ()
    ttl_s: float | None = None
    delay_s: float | None = None
    after: Sequence[ParentRef] = ()
    on_parent_failure: str = "fail"


@dataclass(frozen=True)
class EnqueueResult:
    """One enqueued item's id; ``created=False`` when an item with that id was there."""

    id: str
    created: bool


@dataclass(frozen=True)
class Leased:
    """An item leased to one owner until ``lease_expires_ms``; ``attempt`` counts from 1.
    ``lease_ran_out``: its previous lease expired unresolved (its owner died or hung), so
    this lease is a lease expiry's retry."""

    id: str
    namespace: str
    topic: str
    payload: bytes
    headers: tuple[Header, ...]
    priority: int
    attempt: int
    enqueued_ms: int
    deliver_after_ms: int
    lease_expires_ms: int
    lease_ran_out: bool = False
    checkpoint: bytes | None = None
    checkpoint_kind: str | None = None


#: The states :meth:`~asynctier.queue.store.QueueStore.browse` lists (dead items have
#: their own list).
LIVE_STATES: Final = ("ready", "delayed", "leased", "waiting")


@dataclass(frozen=True)
class Listed:
    """One live item in a browsed page: ``head``, the first bytes of its payload."""

    id: str
    priority: int
    attempts: int
    enqueued_ms: int
    deliver_after_ms: int | None  # None while it waits for its parents
    lease_owner: str | None
    head: bytes


@dataclass(frozen=True)
class Running:
    """One item running now (leased): how long its lease has run, how long ago its
    scheduler last reported it alive, and its last checkpoint (None: none yet)."""

    topic: str
    id: str
    attempt: int
    owner: str
    age_s: float
    heartbeat_age_s: float | None
    checkpoint_age_s: float | None
    checkpoint_bytes: int | None


@dataclass(frozen=True)
class Nack:
    """Give a leased item back, to be leased again after ``delay_s``.

    ``spend_attempt=False`` (throttling, not a failure) gives the attempt back.
    """

    id: str
    delay_s: float
    spend_attempt: bool = True
    error: str = ""


@dataclass(frozen=True)
class Dead:
    """Move a leased item to the dead items, with why."""

    id: str
    reason: str
    error: str = ""


@dataclass(frozen=True)
class Resolved:
    """What one ``resolve`` call applied; ``not_held``: ids the owner no longer leased
    (their lease ran out and another owner took them, or they were cancelled)."""

    acked: int = 0
    nacked: int = 0
    dead: int = 0
    not_held: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopicCounts:
    """One topic's items by state; ``oldest_ready_age_s``: how long the oldest ready item
    has waited to be leased (0 when none is ready)."""

    namespace: str
    topic: str
    ready: int = 0
    delayed: int = 0
    leased: int = 0
    dead: int = 0
    oldest_ready_age_s: float = 0.0
    waiting: int = 0


@dataclass(frozen=True)
class ItemInfo:
    """One item as ``get`` shows it, in whichever state it is (dead ones too)."""

    id: str
    namespace: str
    topic: str
    state: State
    priority: int
    payload: bytes
    headers: tuple[Header, ...]
    attempts: int
    enqueued_ms: int
    deliver_after_ms: int | None = None
    lease_owner: str | None = None
    lease_expires_ms: int | None = None
    expires_ms: int | None = None
    last_error: str = ""
    reason: str = ""
    dead_ms: int | None = None
    leased_ms: int | None = None
    heartbeat_ms: int | None = None
    checkpoint_bytes: int | None = None
    checkpoint_ms: int | None = None
    waiting_on: int = 0
    released_ms: int | None = None
    parents: tuple[tuple[str, str, str], ...] = ()
    children: tuple[ParentRef, ...] = ()

    @property
    def trace_id(self) -> str:
        """The trace its runs are in (Jaeger's id)."""
        return trace_id_of(self.headers, item_ref(self.namespace, self.topic, self.id))


@dataclass(frozen=True)
class DeadItem:
    """A dead item: kept with its reason and last error until replayed or cancelled."""

    id: str
    namespace: str
    topic: str
    priority: int
    payload: bytes
    headers: tuple[Header, ...] = field(default=())
    attempts: int = 0
    enqueued_ms: int = 0
    reason: str = ""
    error: str = ""
    dead_ms: int = 0


# --------------------------------------------------------------------------- checks


def item_ref(namespace: str, topic: str, item_id: str) -> str:
    """An item's reference as its runs see it (``ctx.source``, the run-once key, the trace
    an item without one is in)."""
    return f"queue/{namespace}/{topic}/{item_id}"


def check_namespace(namespace: str) -> None:
    """A namespace is a binding's tenant: letters, digits, '_', '.', '-' (1-63)."""
    if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
        raise QueueError(f"namespace {namespace!r} is not valid: use 1 to 63 letters, digits, "
                         "'_', '.' or '-', starting with a letter or digit")


def check_topic(topic: str, where: str = "") -> None:
    """Queue topic names follow Kafka's rule: 1-249 of letters, digits, '.', '_', '-'."""
    if (not isinstance(topic, str) or not _TOPIC_RE.fullmatch(topic)
            or topic in (".", "..")):
        raise QueueError(f"{where}topic {topic!r} is not a valid topic name: use 1 to 249 letters, "
                         "digits, '.', '_' or '-' (as for a Kafka topic)")


def check_id(item_id: str, where: str = "") -> None:
    """Ids are 1 to 200 printable characters."""
    if (not isinstance(item_id, str) or not 1 <= len(item_id) <= MAX_ID_CHARS
            or not item_id.isprintable()):
        raise QueueError(f"{where}id {item_id!r} is not valid: an id is 1 to {MAX_ID_CHARS} "
                         "printable characters (no control characters or newlines)")


def new_item_id() -> str:
    """An id for an item its producer did not name: 32 hex characters, the first 12 the
    milliseconds since the epoch, the other 20 random (80 bits). Ids made one after the
    other sort together, so an enqueue writes to the last pages of the primary key's index
    instead of random ones across it (``make bench-queue``'s enqueue)."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def check_priority(priority: int, where: str = "") -> None:
    """Priorities are integers from -1000 to 1000."""
    if (not isinstance(priority, int) or isinstance(priority, bool)
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise QueueError(f"{where}priority {priority!r} is out of range: give an integer from "
                         f"{MIN_PRIORITY} to {MAX_PRIORITY} (higher runs first)")


def check_seconds(value: float, what: str, where: str = "") -> None:
    """A delay, lease or TTL: a finite number of seconds from 0 to 365 days."""
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or not 0 <= value <= MAX_DELAY_S):
        raise QueueError(f"{where}{what} {value!r} is not valid: give seconds from 0 to "
                         f"{MAX_DELAY_S:g} (365 days)")


@functools.lru_cache(maxsize=1024)
def _topic_ok(topic: str) -> bool:
    return _TOPIC_RE.fullmatch(topic) is not None and topic not in (".", "..")


def _plainly_fine(item: NewItem) -> bool:
    """The usual item (no delays, TTL or headers) passes every rule: checked without
    building the messages of the full check, which took most of an enqueue's time per
    item in a busy Submitter. False: leave it to the full check."""
    item_id, priority, payload = item.id, item.priority, item.payload
    return (type(item.topic) is str and _topic_ok(item.topic)
            and (item_id is None or (type(item_id) is str and 0 < len(item_id) <= MAX_ID_CHARS
                                     and item_id.isprintable()))
            and type(priority) is int and MIN_PRIORITY <= priority <= MAX_PRIORITY
            and type(payload) is bytes and len(payload) <= MAX_PAYLOAD_BYTES
            and item.ttl_s is None and item.delay_s is None
            and item.deliver_after_ms is None and not item.headers and not item.after)


def check_new_item(item: NewItem, position: int) -> None:
    """Every rule a new item must meet; the error names its place in the batch and id."""
    if _plainly_fine(item):
        return
    where = f"item {position} ({item.id!r}) of topic {item.topic!r}: " if item.id \
        else f"item {position} of topic {item.topic!r}: "
    check_topic(item.topic, f"item {position}: ")
    if item.id is not None:
        check_id(item.id, where)
    check_priority(item.priority, where)
    if not isinstance(item.payload, bytes | bytearray | memoryview):
        raise QueueError(f"{where}the payload is {type(item.payload).__name__}: give bytes")
    if len(item.payload) > MAX_PAYLOAD_BYTES:
        raise QueueError(f"{where}the payload is {len(item.payload):,} bytes, over the "
                         f"{MAX_PAYLOAD_BYTES:,}-byte limit: store big inputs elsewhere and "
                         "enqueue their address")
    if item.ttl_s is not None:
        check_seconds(item.ttl_s, "ttl_s", where)
    if item.delay_s is not None:
        check_seconds(item.delay_s, "delay_s", where)
    if item.deliver_after_ms is not None and (
            not isinstance(item.deliver_after_ms, int) or item.deliver_after_ms < 0):
        raise QueueError(f"{where}deliver_after_ms {item.deliver_after_ms!r} is not valid: "
                         "give epoch milliseconds (or None for now)")
    for name, value in item.headers:
        if not isinstance(name, str) or not (value is None or isinstance(value, bytes)):
            raise QueueError(f"{where}header {name!r}: a header is (str name, bytes or None)")
        if not _storable(name):
            raise QueueError(f"{where}header {name!r}: a header name is text without NUL "
                             "characters or lone surrogates (PostgreSQL cannot store them)")
    _check_after(item, where)


def _storable(text: str) -> bool:
    """Whether PostgreSQL can store ``text`` in a text or JSON value."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _check_after(item: NewItem, where: str) -> None:
    if item.on_parent_failure not in ON_PARENT_FAILURE:
        raise QueueError(f"{where}on_parent_failure {item.on_parent_failure!r} is not one of "
                         f"{', '.join(ON_PARENT_FAILURE)}")
    for parent in item.after:
        if not isinstance(parent, tuple) or len(parent) != 2:
            raise QueueError(f"{where}parent {parent!r} is not (topic, id)")
        check_topic(parent[0], f"{where}parent: ")
        check_id(parent[1], f"{where}parent: ")
        if parent == (item.topic, item.id):
            raise QueueError(f"{where}it names itself as its parent")
