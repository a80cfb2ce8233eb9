"""The hand-off: records that did not succeed go to a delay topic or the dead-letter topic.

Every tailer resolves outcomes through :class:`Handoff`, so the main tailer and the delay
tailers treat a ``retry`` or ``failed`` outcome the same way. Nothing is committed by the
caller until :meth:`Handoff.confirm` returned (every record delivered).

Delay and dead-letter records keep the original value and key; the platform's headers
(``asynctier.*``, see :mod:`asynctier.platform.names`) say where the record came from,
which attempt comes next, when it is due and why it failed. A delay record carries them
packed in one header (``asynctier.delay``) unless ``delay_headers = "separate"`` (the
upgrade from a version that reads only separate ones); a dead letter, read by operators'
tools, carries them one by one. Both forms are read.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException

from asynctier.delay_streams.ladder import ladder_delay, next_hop
from asynctier.delay_streams.topics import MAX_MESSAGE_BYTES
from asynctier.platform import metrics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.durations import epoch_ms, format_duration
from asynctier.platform.errors import MAX_RETRY_AFTER_S, HandoffError
from asynctier.platform.framed import schema_id_of
from asynctier.platform.kafka import (
    DLQ_MAX_MESSAGE_BYTES,
    PRODUCE_ANY_PARTITION,
    ConfirmingProducer,
    admin,
    produce_by_position,
    raise_topic_minimums,
)
from asynctier.platform.wire import MAX_ATTEMPTS, REJECTED, TOO_LARGE, Outcome

log = logging.getLogger(__name__)
ERROR_MAX_CHARS = 1000
Resolution = Literal["ok", "retry", "dead_letter"]


@dataclass(slots=True)
class Parcel:
    """A record that is leaving its topic: its bytes and what the platform knows of it."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    origin: str
    attempt: int
    first_seen_ms: int
    due_ms: int = 0
    error: str = ""


#: Bounds on what platform headers may say; a value outside them (written by hand, or by
#: a producer that copied headers) is read as absent, so no header can wedge a partition.
MAX_ATTEMPT = 1000
MAX_ORIGIN_CHARS = 600
_DAY_MS = 86_400_000
_MAX_AHEAD_MS = int(MAX_RETRY_AFTER_S * 1000) + _DAY_MS


def _int(value: bytes | None, default: int, low: int, high: int) -> int:
    """The header as an int within ``low..high``; ``default`` when absent or not one."""
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        return default
    return number if low <= number <= high else default


def record_time_ms(msg: Any, now_ms: int) -> int:
    """The record's time for a record without platform headers: its Kafka timestamp (the
    time its deadline counts from on the main path too), or ``now_ms`` when it has none
    or one more than a day ahead."""
    kind, ms = msg.timestamp()
    return ms if kind != TIMESTAMP_NOT_AVAILABLE and 0 < ms <= now_ms + _DAY_MS else now_ms


def where(msg: Any) -> str:
    """A Kafka record's place, ``topic/partition/offset``: its origin when it has none, a
    moved record's queue id."""
    return f"{msg.topic()}/{msg.partition()}/{msg.offset()}"


#: The packed delay header's format (:data:`~asynctier.platform.names.H_DELAY`): the
#: version, then binding, attempt, due, origin, first seen and error, one per line (the
#: error last: it may hold line breaks; the others cannot).
DELAY_FORMAT = b"1"
_PACKED = (n.H_BINDING, n.H_ATTEMPT, n.H_DUE, n.H_ORIGIN, n.H_FIRST_SEEN, n.H_ERROR)


def _packed_around(binding: str, attempt: int, due_ms: int, error: str) -> tuple[bytes, bytes]:
    """A packed delay value's bytes before a record's origin, and after its first-seen
    time."""
    head = b"\n".join((DELAY_FORMAT, binding.encode(), str(attempt).encode(),
                       str(due_ms).encode(), b""))
    return head, b"\n" + error[:ERROR_MAX_CHARS].encode("utf-8", "replace")


def pack_delay(binding: str, attempt: int, due_ms: int, origin: str, first_seen_ms: int,
               error: str) -> bytes:
    """A delay record's platform headers as one :data:`~asynctier.platform.names.H_DELAY`
    value (:func:`unpack_delay` reads it)."""
    head, tail = _packed_around(binding, attempt, due_ms, error)
    return b"".join((head, origin.encode(), b"\n", str(first_seen_ms).encode(), tail))


def unpack_delay(value: bytes | None) -> dict[str, bytes]:
    """The headers a packed delay value holds, by their own names; none when it is not of
    a format this version reads (records are data: read as absent, like any insane
    platform header)."""
    if not value:
        return {}
    parts = value.split(b"\n", len(_PACKED))
    if parts[0] != DELAY_FORMAT or len(parts) != len(_PACKED) + 1:
        return {}
    return {name: part for name, part in zip(_PACKED, parts[1:], strict=True) if part}


def platform_header(msg: Any, name: str) -> bytes | None:
    """The value of platform header ``name`` (packed or on its own); the last one when a
    producer wrote it more than once, as :func:`parcel_from_message` reads it."""
    found = None
    for key, value in msg.headers() or ():
        if key == name:
            found = value
        elif key == n.H_DELAY:
            found = unpack_delay(value).get(name, found)
    return found


def parcel_from_message(msg: Any, now_ms: int | None = None) -> Parcel:
    """A Parcel from a confluent-kafka Message of a source, delay or dead-letter topic.

    Platform headers (packed in one, or each on its own), when present, say the origin
    and attempt; otherwise the record is
    new: attempt 1, its origin is where it sits now. A header that is not a sane value (an
    attempt out of 1..1000, a time more than a year ahead, an origin with a line break) is
    ignored the same way: records are data, and a producer may write anything.
    """
    user: list[tuple[str, bytes | None]] = []
    plat: dict[str, bytes | None] = {}
    for name, value in msg.headers() or ():
        if name == n.H_DELAY:
            plat.update(unpack_delay(value))
        elif name in n.PLATFORM_HEADERS:
            plat[name] = value
        else:
            user.append((name, value))
    now_ms = epoch_ms() if now_ms is None else now_ms
    raw = plat.get(n.H_ORIGIN)
    origin = raw.decode("utf-8", "replace") if raw else ""
    if not origin or "\n" in origin or len(origin) > MAX_ORIGIN_CHARS:
        origin = where(msg)
    return Parcel(
        value=msg.value(),
        key=msg.key(),
        headers=user,
        origin=origin,
        attempt=_int(plat.get(n.H_ATTEMPT), 1, 1, MAX_ATTEMPT),
        first_seen_ms=_int(plat.get(n.H_FIRST_SEEN), record_time_ms(msg, now_ms), 0,
                           now_ms + _DAY_MS),
        due_ms=_int(plat.get(n.H_DUE), 0, 0, now_ms + _MAX_AHEAD_MS),
        error=(plat.get(n.H_ERROR) or b"").decode("utf-8", "replace"),
    )


#: What a delay record may take beyond the record's own key, value and headers: the
#: platform's headers at their largest (the error text is cut to ERROR_MAX_CHARS
#: characters, the origin to MAX_ORIGIN_CHARS) and the record batch it travels in.
DELAY_OVERHEAD_BYTES = ERROR_MAX_CHARS * 4 + MAX_ORIGIN_CHARS + 2048
#: A record whose value is no larger than this may take the fast path of a retry flood:
#: its key and headers cannot take it over a delay topic's :data:`MAX_MESSAGE_BYTES`.
FAST_MAX_BYTES = MAX_MESSAGE_BYTES // 2


def record_bytes(parcel: Parcel) -> int:
    """The bytes of ``parcel``'s own key, value and headers."""
    size = len(parcel.value or b"") + len(parcel.key or b"")
    for name, value in parcel.headers:
        size += len(name.encode()) + len(value or b"")
    return size


@dataclass(slots=True)
class _Plan:
    """The topic and packed header shared by a batch's fresh records that fail the same
    way: each record's origin and first-seen time (its Kafka timestamp) go between
    ``head`` and ``tail``."""

    topic: str
    head: bytes
    tail: bytes
    step: str
    partition: int = PRODUCE_ANY_PARTITION
    count: int = 0


def _due_ms(binding: Binding, attempt: int, after_s: float | None, now_ms: int) -> int:
    """When a record that failed ``attempt`` is due: ``after_s`` from now, else its ladder
    step; rounded up to the millisecond (never early)."""
    if after_s is None:
        after_s = ladder_delay(attempt, binding.retries.ladder_s)
    return now_ms + int(after_s * 1000 + 0.999)


def _retry_step(attempt: int, spends: bool) -> str:
    """The retries metric's step: the attempt that failed, or ``held`` (no attempt spent)."""
    return str(attempt) if spends else "held"


@functools.lru_cache(maxsize=4096)
def first_hop(remaining_ms: int, ladder: tuple[float, ...]) -> str:
    """The interval name (``30s``...) of the first hop for a record due in ``remaining_ms``
    (remembered: records of a batch mostly wait the same ladder step)."""
    hop = next_hop(remaining_ms / 1000.0, ladder)
    return format_duration(min(ladder) if hop is None else hop)


#: How long a delay topic's partition count is trusted before the broker is asked again,
#: and how long "could not tell" is (the records then go where the client puts them).
PARTITIONS_TTL_S = 300.0
PARTITIONS_RETRY_S = 30.0


class Handoff:
    """Writes delay and dead-letter records through one confirming producer.

    The delay records of one hand-off cycle (everything produced until the next
    :meth:`confirm`: a tailer's batch, or a few) go to one partition of each delay topic,
    the next partition at the next cycle. Left to the client's partitioner, the records of
    a batch with keys were spread over every partition by their keys (a key means nothing
    in a delay topic: a record's own key and partition are in its origin), and each
    partition got a small request of its own, which cost the broker more per record
    (``python -m bench.handoff_cost --keys``; figures in bench/RESULTS.md).
    """

    def __init__(self, settings: Settings, producer: ConfirmingProducer | None = None) -> None:
        self.settings = settings
        self.names = settings.names
        self.producer = producer or ConfirmingProducer(settings)
        # delay records' platform headers packed in one (docs/operations.md, Upgrades)
        self.packed = settings.delay_headers == "packed"
        self._retries: Counter[tuple[str, str]] = Counter()
        self._dead: Counter[tuple[str, str]] = Counter()
        self._cycles = 0  # confirm() calls so far: each cycle writes the next partition
        # per delay topic: its partition count, when (monotonic) to ask for it again, and
        # the partition of cycle 0 (random: tailers started together spread at once)
        self._topics: dict[str, tuple[int | None, float, int]] = {}

    def resolve(self, binding: Binding, parcel: Parcel, outcome: Outcome,
                now_ms: int | None = None) -> Resolution:
        """Hand off one outcome; return what became of the record."""
        status = outcome["status"]
        if status == "ok":
            return "ok"
        error = outcome["error"] or status
        if status == "failed":
            self.dead_letter(binding, parcel, outcome["reason"] or REJECTED, error,
                             parcel.attempt)
            return "dead_letter"
        spends = outcome["spends_attempt"]
        if spends and parcel.attempt >= binding.retries.max_attempts:
            self.dead_letter(binding, parcel, MAX_ATTEMPTS, error, parcel.attempt)
            return "dead_letter"
        size = record_bytes(parcel)
        if size + DELAY_OVERHEAD_BYTES > MAX_MESSAGE_BYTES:
            # A delay topic would refuse it at every try, and its batch (so its binding)
            # would wait behind it forever: it is not retried but kept, whole.
            self.dead_letter(binding, parcel, TOO_LARGE,
                             f"{error} (not retried: the record's {size:,} bytes and the "
                             f"platform's headers do not fit the {MAX_MESSAGE_BYTES:,} bytes "
                             "a delay topic takes)", parcel.attempt)
            return "dead_letter"
        now_ms = epoch_ms() if now_ms is None else now_ms
        due_ms = _due_ms(binding, parcel.attempt, outcome["after_s"], now_ms)
        next_attempt = parcel.attempt + 1 if spends else parcel.attempt
        self.delay(binding, parcel, due_ms, next_attempt, error, now_ms)
        self._retries[(binding.name, _retry_step(parcel.attempt, spends))] += 1
        return "retry"

    def resolve_messages(self, binding: Binding, messages: Sequence[Any],
                         outcomes: Sequence[Outcome],
                         origins: Sequence[str] | None = None,
                         batch_bytes: int | None = None) -> Counter[str]:
        """Hand off every outcome of a batch of consumed messages (an outcome's ``id`` is
        its index in ``messages``, and in ``origins``, their ``topic/partition/offset``
        when the caller has them already; ``batch_bytes``: the keys, values and headers of
        all of them, when known); count what became of them.

        Each record gets what :meth:`resolve` would give it, but the common case of a retry
        flood (a record without headers, so on attempt 1, to be retried)
        has its topic and headers worked out once per batch: only its origin differs from
        its neighbours'. Those records go straight to the Kafka client; a full queue or a
        refusal takes the careful path (:meth:`ConfirmingProducer.produce`). What this
        saves per record in a retry flood: ``python -m bench.handoff_cost``.
        """
        counts: Counter[str] = Counter()
        now_ms = epoch_ms()
        plans: dict[tuple[str | None, float | None, bool], _Plan] = {}
        may_retry = binding.retries.max_attempts > 1  # else attempt 1 is the last: a dead letter
        sizes = batch_bytes is None or batch_bytes > FAST_MAX_BYTES  # a record may be large
        produce, fast = self.producer.produce, self.producer.client_produce
        for outcome in outcomes:
            status = outcome["status"]
            if status == "ok":
                counts["ok"] += 1
                continue
            msg = messages[outcome["id"]]
            spends = outcome["spends_attempt"]
            if (status != "retry" or msg.headers() or not self.packed
                    or (spends and not may_retry)
                    or (sizes and len(msg.value() or b"") + len(msg.key() or b"")
                        > FAST_MAX_BYTES)):
                parcel = parcel_from_message(msg, now_ms)
                counts[self.resolve(binding, parcel, outcome, now_ms)] += 1
                continue
            key = (outcome["error"], outcome["after_s"], spends)
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = self._fresh_plan(binding, outcome, now_ms)
            origin = (origins[outcome["id"]] if origins is not None
                      else f"{msg.topic()}/{msg.partition()}/{msg.offset()}").encode()
            seen = str(record_time_ms(msg, now_ms)).encode()
            headers: list[tuple[str, bytes | None]] = [
                (n.H_DELAY, b"".join((plan.head, origin, b"\n", seen, plan.tail)))]
            try:
                produce_by_position(fast, plan.topic, msg.value(), msg.key(), plan.partition,
                                    0, headers)
            except (BufferError, KafkaException):
                produce(plan.topic, msg.value(), msg.key(), headers, partition=plan.partition)
            plan.count += 1
        for plan in plans.values():
            self._retries[(binding.name, plan.step)] += plan.count
            counts["retry"] += plan.count
        return counts

    def _fresh_plan(self, binding: Binding, outcome: Outcome, now_ms: int) -> _Plan:
        """Where a retried record seen for the first time goes, and its packed header
        around its origin (the header :meth:`delay` writes)."""
        spends = outcome["spends_attempt"]
        due_ms = _due_ms(binding, 1, outcome["after_s"], now_ms)
        topic = self.names.delay_topic(first_hop(due_ms - now_ms, binding.retries.ladder_s))
        head, tail = _packed_around(binding.name, 2 if spends else 1, due_ms,
                                    outcome["error"] or outcome["status"])
        return _Plan(topic, head, tail, _retry_step(1, spends), self.partition(topic))

    def delay(self, binding: Binding, parcel: Parcel, due_ms: int, attempt: int,
              error: str, now_ms: int | None = None) -> str:
        """Write the record to the delay topic of its first hop towards ``due_ms``."""
        now_ms = epoch_ms() if now_ms is None else now_ms
        topic, headers = self._delay_record(binding, parcel, due_ms, attempt, error, now_ms)
        self.producer.produce(topic, parcel.value, parcel.key, headers,
                              partition=self.partition(topic))
        return topic

    def partition(self, topic: str) -> int:
        """The partition of ``topic`` this hand-off cycle writes to (see the class); any
        (:data:`PRODUCE_ANY_PARTITION`) when the broker could not tell how many it has."""
        now = time.monotonic()
        known = self._topics.get(topic)
        if known is None or now >= known[1]:
            count = self.producer.partition_count(topic)
            first = known[2] if known is not None else random.randrange(1 << 30)
            known = self._topics[topic] = (
                count, now + (PARTITIONS_TTL_S if count else PARTITIONS_RETRY_S), first)
        count = known[0]
        return PRODUCE_ANY_PARTITION if count is None else (known[2] + self._cycles) % count

    def _delay_record(self, binding: Binding, parcel: Parcel, due_ms: int, attempt: int,
                      error: str, now_ms: int) -> tuple[str, list[tuple[str, bytes | None]]]:
        """The delay topic and headers of ``parcel`` due at ``due_ms``."""
        topic = self.names.delay_topic(first_hop(due_ms - now_ms, binding.retries.ladder_s))
        if self.packed:
            return topic, [*parcel.headers, (n.H_DELAY, pack_delay(
                binding.name, attempt, due_ms, parcel.origin, parcel.first_seen_ms, error))]
        headers = self._headers(binding, parcel, attempt, error)
        headers.append((n.H_DUE, str(due_ms).encode()))
        return topic, headers

    def dead_letter(self, binding: Binding | str, parcel: Parcel, reason: str, error: str,
                    attempts_made: int) -> str:
        """Write the record to the binding's dead-letter topic with every header."""
        name = binding if isinstance(binding, str) else binding.name
        topic = self.names.dlq_topic(name)
        headers = self._headers(binding, parcel, parcel.attempt, error)
        headers.append((n.H_ATTEMPTS_MADE, str(attempts_made).encode()))
        headers.append((n.H_REASON, reason.encode()))
        schema_id = framed_schema_id(binding, parcel.value)
        if schema_id is not None:
            headers.append((n.H_SCHEMA_ID, str(schema_id).encode()))
        if parcel.due_ms:
            headers.append((n.H_DUE, str(parcel.due_ms).encode()))
        need = record_bytes(parcel) + DELAY_OVERHEAD_BYTES
        if need > DLQ_MAX_MESSAGE_BYTES:
            self._dead_letter_oversized(topic, parcel, headers, need)
        else:
            self.producer.produce(topic, parcel.value, parcel.key, headers)
        self._dead[(name, reason)] += 1
        return topic

    def _dead_letter_oversized(self, topic: str, parcel: Parcel,
                               headers: list[tuple[str, bytes | None]], need: int) -> None:
        """Write a record larger than a dead-letter topic takes (only a source topic
        configured past :data:`DLQ_MAX_MESSAGE_BYTES` holds one) at once, whole: the topic's
        ``max.message.bytes`` is raised to fit it and a producer of its own, allowed that
        size, writes it and waits for its delivery. Raises HandoffError if it was not
        delivered (the caller tries again, as with any hand-off)."""
        log.warning("a dead letter of %s bytes for %s, more than the %s a dead-letter topic "
                    "takes by default: raising %s's max.message.bytes to fit it",
                    f"{need:,}", topic, f"{DLQ_MAX_MESSAGE_BYTES:,}", topic)
        raise_topic_minimums(admin(self.settings), {topic: {"max.message.bytes": need}})
        producer = ConfirmingProducer(self.settings,
                                      **{"message.max.bytes": need + 1024 * 1024})
        try:
            producer.produce(topic, parcel.value, parcel.key, headers)
            producer.confirm(60.0)
        finally:
            producer.close(0)

    def _headers(self, binding: Binding | str, parcel: Parcel, attempt: int,
                 error: str) -> list[tuple[str, bytes | None]]:
        name = binding if isinstance(binding, str) else binding.name
        return [
            *parcel.headers,
            (n.H_BINDING, name.encode()),
            (n.H_ATTEMPT, str(attempt).encode()),
            (n.H_ORIGIN, parcel.origin.encode()),
            (n.H_ERROR, error[:ERROR_MAX_CHARS].encode("utf-8", "replace")),
            (n.H_FIRST_SEEN, str(parcel.first_seen_ms).encode()),
        ]

    def confirm(self, timeout_s: float = 30.0) -> None:
        """Raise HandoffError unless every record handed off so far is delivered.

        Retries (by the attempt that failed) and dead letters (by reason) are counted in
        the metrics once they are delivered."""
        retries, dead = self._retries, self._dead
        self._retries, self._dead = Counter(), Counter()
        self._cycles += 1  # the next cycle writes to the next partitions
        try:
            self.producer.confirm(timeout_s)
        except HandoffError:
            self._topics.clear()  # a topic may have been made again, with fewer partitions
            raise
        try:
            for (binding, step), count in retries.items():
                metrics.record_retries(binding, {step: count})
            for (binding, reason), count in dead.items():
                metrics.record_dead_letters(binding, {reason: count})
        except ValueError:  # a metric must never break the data path
            log.exception("could not count hand-offs in the metrics")


def framed_schema_id(binding: Binding | str, value: bytes | None) -> int | None:
    """The schema id of a registry-framed binding's payload (None: another format, or not
    framed)."""
    if isinstance(binding, str) or binding.payload.schema_registry is None:
        return None
    return schema_id_of(value)
