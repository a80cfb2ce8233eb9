"""Dead letters: read them, show one, and replay them through the scheduler.

A binding's dead-letter topic ``<prefix>.dlq.<binding>`` (one partition) holds each record
with its original value, key and headers plus the platform's (attempts made, reason, last
error, first seen, origin).

Replay submits the dead letters to the scheduler as attempt 1 of a fresh ladder and hands
every outcome that is not a success off through :class:`Handoff`, as a tailer does. It is
at-least-once: the replay group ``<prefix>.dlq-replay.<binding>`` commits past a batch only
after every outcome of it was resolved and every hand-off confirmed, so a second replay
starts where the first stopped (``from_start`` goes back to the first dead letter). Only
the dead letters present when the replay starts are replayed: one that fails again and
comes back to the topic waits for the next replay. Run one replay per binding at a time.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.handoff import Handoff, parcel_from_message
from asynctier.delay_streams.release import Entry, hand_off, make_entry, resolutions, submit
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError
from asynctier.platform.kafka import admin
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.tracing import trace_id_of
from asynctier.platform.wire import Outcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter topic."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    def header(self, name: str) -> str:
        """A header as text ('' when absent)."""
        for key, value in self.headers:
            if key == name:
                return (value or b"").decode("utf-8", "replace")
        return ""

    def number(self, name: str) -> int:
        """A header as a non-negative int of at most 18 digits (0 when absent or not one:
        ``"²".isdigit()`` is true, and a header may hold anything)."""
        text = self.header(name)
        return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else 0

    @property
    def attempts(self) -> int:
        """Attempts made before the record was given up."""
        return self.number(n.H_ATTEMPTS_MADE)

    @property
    def first_seen_ms(self) -> int:
        """When the platform first took the record (epoch ms; 0 when unknown)."""
        return self.number(n.H_FIRST_SEEN)

    def summary(self) -> dict[str, Any]:
        """What ``dlq list`` shows."""
        return {
            "offset": self.offset,
            "key": show_bytes(self.key)[1],
            "attempts": self.attempts,
            "first_seen": iso_ms(self.first_seen_ms),
            "dead_lettered": iso_ms(self.timestamp_ms),
            "reason": self.header(n.H_REASON),
            "error": self.header(n.H_ERROR),
            "origin": self.header(n.H_ORIGIN),
            "trace": trace_id_of(self.headers, self.header(n.H_ORIGIN)),
        }

    def detail(self) -> dict[str, Any]:
        """What ``dlq show`` shows: every header and the value."""
        encoding, value = show_bytes(self.value)
        doc = self.summary()
        doc["headers"] = [{"name": k, "value": show_bytes(v)[1]} for k, v in self.headers]
        doc["value_encoding"] = encoding
        doc["value"] = value
        return doc


def show_bytes(data: bytes | None) -> tuple[str, str | None]:
    """(encoding, text): UTF-8 text when it decodes, else base64."""
    if data is None:
        return "null", None
    try:
        return "utf-8", data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64", base64.b64encode(data).decode("ascii")


def iso_ms(epoch_ms: int) -> str:
    """Epoch ms as ISO-8601 UTC ('' for 0, and for a time no calendar can show)."""
    if not epoch_ms:
        return ""
    try:
        day = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_ms / 1000))
    except (OverflowError, OSError, ValueError):
        return ""
    return f"{day}.{epoch_ms % 1000:03d}Z"


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters a listing shows or a replay takes; every field set must match.

    ``reason`` is the exact reason, ``error`` a piece of the last error (any case), the
    times bound when the record was dead-lettered (epoch ms, ``until_ms`` excluded) and
    ``offsets`` names the chosen ones. The empty filter takes every dead letter."""

    reason: str = ""
    error: str = ""
    since_ms: int = 0
    until_ms: int = 0
    offsets: frozenset[int] = frozenset()

    @property
    def selective(self) -> bool:
        """True unless it takes every dead letter."""
        return self != LetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` passes."""
        return ((not self.offsets or letter.offset in self.offsets)
                and (not self.reason or letter.header(n.H_REASON) == self.reason)
                and (not self.error or self.error.casefold()
                     in letter.header(n.H_ERROR).casefold())
                and letter.timestamp_ms >= self.since_ms
                and (not self.until_ms or letter.timestamp_ms < self.until_ms))


_COORDINATOR_BUSY = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                               KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def _committed(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> int:
    """The replay group's committed offset (-1001: none). A coordinator that is moving or
    still loading the group (``NOT_COORDINATOR``...) is asked again until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left = max(0.1, deadline - time.monotonic())
            return int(consumer.committed([tp], timeout=left)[0].offset)
        except KafkaException as exc:
            err = exc.args[0]
            if (err.code() not in _COORDINATOR_BUSY and not err.retriable()) \
                    or time.monotonic() >= deadline:
                raise
            log.debug("replay: committed offsets not available yet (%s); asking again",
                      err.str())
            time.sleep(0.2)


#: A reader that browses (a page of at most a few hundred records) fetches this little
#: ahead: librdkafka's default prefetch of 64 MiB per consumer made a console that opens
#: readers for its pages hold hundreds of MiB (bench.console_pages prints its peak RSS).
BROWSE_PREFETCH: Final = {"max.partition.fetch.bytes": 65536,
                          "queued.max.messages.kbytes": 1024}


def _consumer(settings: Settings, group: str | None = None) -> Consumer:
    """A reader of dead letters: the replay's (its ``group``, read through at speed), or
    one that browses (a throwaway group, little fetched ahead)."""
    return Consumer(settings.kafka_config(**{
        "group.id": group or f"{settings.prefix}.dlq-reader.{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **({} if group else BROWSE_PREFETCH),
    }))


def _partition(settings: Settings, consumer: Consumer, binding: str,
               timeout_s: float) -> TopicPartition:
    topic = settings.names.dlq_topic(binding)
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise AsynctierError(f"binding {binding!r} has no dead-letter topic ({topic}): "
                             "nothing was ever dead-lettered, or the name is wrong")
    return TopicPartition(topic, 0)


def _read(consumer: Consumer, tp: TopicPartition, start: int, end: int,
          timeout_s: float) -> Iterator[Any]:
    """Messages of ``tp`` from ``start`` up to (not including) ``end``."""
    if start >= end:
        return
    consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
    deadline = time.monotonic() + timeout_s
    position = start
    while time.monotonic() < deadline:
        # no more than are left: else the last call waits its whole timeout for the rest
        for msg in consumer.consume(max(1, min(500, end - position)), 0.5):
            if msg.error() is not None:
                continue
            offset: int = msg.offset() or 0
            if offset >= end:
                return
            yield msg
            position = offset + 1
            deadline = time.monotonic() + timeout_s
            if offset + 1 >= end:
                return
    raise AsynctierError(f"reading {tp.topic} stalled before offset {end}; is the broker up?")


def _letter(msg: Any, with_value: bool = True) -> DeadLetter:
    return DeadLetter(msg.offset(), msg.timestamp()[1], msg.key(),
                      msg.value() if with_value else None, list(msg.headers() or ()))


def list_dead_letters(settings: Settings, binding: str, limit: int | None = None,
                      timeout_s: float = 15.0, start: int | None = None,
                      only: LetterFilter | None = None) -> list[DeadLetter]:
    """The dead letters of ``binding``, oldest first, without their values (a listing shows
    none, and a topic of large records must not fill memory; ``dlq show`` reads one whole).

    It reads at most ``limit`` records from offset ``start`` (the first one kept when
    None) and returns those that pass ``only``."""
    consumer = _consumer(settings)
    try:
        tp = _partition(settings, consumer, binding, timeout_s)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        first = low if start is None else min(max(start, low), high)
        end = high if limit is None else min(high, first + limit)
        letters = (_letter(m, with_value=False)
                   for m in _read(consumer, tp, first, end, timeout_s))
        return [x for x in letters if only is None or only.matches(x)]
    finally:
        consumer.close()


def dead_letter_span(settings: Settings, binding: str,
                     timeout_s: float = 15.0) -> tuple[int, int]:
    """The first offset kept and the next one to be written of ``binding``'s dead-letter
    topic (their difference: how many dead letters it holds)."""
    consumer = _consumer(settings)
    try:
        tp = _partition(settings, consumer, binding, timeout_s)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        return int(low), int(high)
    finally:
        consumer.close()


@dataclass(frozen=True)
class Purged:
    """What a purge did: the dead letters deleted, the ones kept, the first offset kept."""

    deleted: int
    kept: int
    first_kept: int


def purge_dead_letters(settings: Settings, binding: str, everything: bool = False,
                       timeout_s: float = 15.0) -> Purged:
    """Delete ``binding``'s dead letters that a bulk replay has passed (those before the
    replay group's position: ``dlq replay`` without a filter moves it), or every one
    (``everything``). Kafka deletes up to an offset (``DeleteRecords``), so a dead letter
    a chosen or filtered replay ran, but that lies after one never replayed, is kept."""
    consumer = _consumer(settings, settings.names.dlq_replay_group(binding))
    try:
        tp = _partition(settings, consumer, binding, timeout_s)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        replayed = -1 if everything else _committed(consumer, tp, timeout_s)
    finally:
        consumer.close()
    upto = high if everything else min(max(replayed, low), high)
    if upto > low:
        client = admin(settings)  # kept until its futures are resolved: they need it
        futures = client.delete_records([TopicPartition(tp.topic, 0, upto)],
                                        request_timeout=timeout_s)
        for future in futures.values():
            future.result(timeout=timeout_s + 5)
        log.info("dead letters of %s: deleted offsets %d to %d (%s); %d kept", binding,
                 low, upto - 1, "all" if everything else "replayed", high - upto)
    return Purged(max(0, upto - low), high - max(upto, low), max(upto, low))


def show_dead_letter(settings: Settings, binding: str, offset: int,
                     timeout_s: float = 15.0) -> DeadLetter:
    """The dead letter at ``offset``; AsynctierError when there is none."""
    consumer = _consumer(settings)
    try:
        tp = _partition(settings, consumer, binding, timeout_s)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        if not low <= offset < high:
            raise AsynctierError(f"no dead letter at offset {offset} of binding {binding!r}: "
                                 f"offsets {low} to {high - 1} exist")
        for msg in _read(consumer, tp, offset, offset + 1, timeout_s):
            return _letter(msg)
        raise AsynctierError(f"no dead letter at offset {offset} of binding {binding!r}")
    finally:
        consumer.close()


# -- replay ------------------------------------------------------------------------------


@dataclass
class ReplayOptions:
    """How ``dlq replay`` goes."""

    rate_per_s: float | None = None
    limit: int | None = None
    dry_run: bool = False
    canary: int = 0
    from_start: bool = False
    batch_size: int = 100
    window: int = 50
    max_failure_ratio: float = 0.5
    timeout_s: float = 15.0
    #: Only the dead letters that pass (the chosen offsets, a reason...). Such a replay
    #: leaves the replay position where it was: the ones it skipped are still to replay.
    only: LetterFilter = field(default_factory=LetterFilter)


@dataclass
class ReplayReport:
    """What a replay did."""

    start_offset: int = 0
    end_offset: int = 0
    planned: int = 0
    replayed: int = 0
    ok: int = 0
    retried: int = 0
    dead_lettered: int = 0
    next_offset: int = 0
    stopped: str = ""
    offsets: list[int] = field(default_factory=list)


Progress = Callable[[ReplayReport], None]


def _failed(outcome: Outcome) -> bool:
    """A replay failure: the function failed (quota or back-pressure retries are not)."""
    return outcome["status"] == "failed" or (outcome["status"] == "retry"
                                             and outcome["spends_attempt"])


class _Window:
    """The last ``size`` outcomes; trips when the failure ratio reaches ``ratio``."""

    def __init__(self, size: int, ratio: float) -> None:
        self.recent: deque[bool] = deque(maxlen=max(size, 1))
        self.ratio = ratio

    def add(self, failures: list[bool]) -> str:
        self.recent.extend(failures)
        bad = sum(self.recent)
        full = len(self.recent) >= min(self.recent.maxlen or 1, 10)
        if full and bad / len(self.recent) >= self.ratio:
            return (f"replays are failing: {bad} of the last {len(self.recent)} failed "
                    f"(threshold {self.ratio:.0%})")
        return ""


class Replay:
    """One run of ``dlq replay BINDING``."""

    def __init__(self, settings: Settings, binding: str, options: ReplayOptions,
                 client: SchedulerClient | None = None, stop: threading.Event | None = None,
                 progress: Progress | None = None) -> None:
        self.settings = settings
        self.name = binding
        self.options = options
        self.client = client
        self.stop = stop or threading.Event()
        self.progress = progress or (lambda report: None)
        self.report = ReplayReport()
        self.consumer = _consumer(settings, settings.names.dlq_replay_group(binding))

    def plan(self) -> ReplayReport:
        """Where the replay starts and ends (also the whole of a dry run)."""
        o = self.options
        self.tp = _partition(self.settings, self.consumer, self.name, o.timeout_s)
        low, high = self.consumer.get_watermark_offsets(self.tp, timeout=o.timeout_s)
        committed = _committed(self.consumer, self.tp, o.timeout_s)
        start = low if o.from_start or committed < 0 else max(committed, low)
        if o.only.offsets:  # the chosen ones, wherever the replay position is
            start = max(low, min(o.only.offsets))
            high = min(high, max(o.only.offsets) + 1)
        end = high if o.limit is None else min(high, start + o.limit)
        report = self.report
        report.start_offset, report.end_offset = start, max(start, end)
        report.planned = max(0, end - start)
        report.next_offset = start
        return report

    def run(self) -> ReplayReport:
        """Replay (or, dry, only plan); returns the report."""
        try:
            self.plan()
            if self.options.dry_run or not self.report.planned:
                return self.report
            binding = self._binding()
            self._replay(binding)
            return self.report
        finally:
            self.consumer.close()

    def _binding(self) -> Binding:
        binding = BindingRegistry(self.settings).load(self.options.timeout_s).get(self.name)
        if binding is None:
            raise AsynctierError(f"binding {self.name!r} does not exist: bind it again "
                                 "(`asynctier bind`) before replaying its dead letters")
        ensure_binding_topics(self.settings, [binding])
        return binding

    def _replay(self, binding: Binding) -> None:
        if self.client is None:
            raise AsynctierError("no scheduler client to replay with")
        handoff = Handoff(self.settings)
        window = _Window(self.options.window, self.options.max_failure_ratio)
        only = self.options.only
        messages = (m for m in _read(self.consumer, self.tp, self.report.start_offset,
                                     self.report.end_offset, self.options.timeout_s)
                    if only.matches(_letter(m, with_value=False)))
        started = 0.0  # when the first batch left: the rate counts from there
        first = True
        while not self.stop.is_set():
            canary = first and self.options.canary
            size = self.options.canary if canary else self.options.batch_size
            if self.options.rate_per_s and not canary:
                size = min(size, max(1, math.ceil(self.options.rate_per_s)))  # no bursts
            batch = [m for _, m in zip(range(size), messages, strict=False)]
            if not batch:
                return
            started = started or time.monotonic()
            self._pace(started)
            outcomes = self._resolve(binding, handoff, batch)
            failures = [_failed(o) for o in outcomes]
            self.progress(self.report)
            if canary and any(o["status"] != "ok" for o in outcomes):
                bad = sum(o["status"] != "ok" for o in outcomes)
                self.report.stopped = (f"canary: {bad} of {len(outcomes)} did not succeed; "
                                       "not going on")
                return
            self.report.stopped = window.add(failures)
            if self.report.stopped:
                return
            first = False

    def _pace(self, started: float) -> None:
        """Wait until the next record is due at the rate (a call carries at most one
        second's worth, rounded up, so no second sees much more than the rate)."""
        rate = self.options.rate_per_s
        if rate:
            wait = started + self.report.replayed / rate - time.monotonic()
            if wait > 0:
                self.stop.wait(wait)

    def _resolve(self, binding: Binding, handoff: Handoff, batch: list[Any]) -> list[Outcome]:
        entries: list[Entry] = []
        for msg in batch:
            parcel = parcel_from_message(msg)
            parcel.attempt, parcel.due_ms = 1, 0
            ref = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
            # where it was first read: its replay's trace links to the trace it was in
            entries.append(make_entry(len(entries), binding, parcel, ref,
                                      [(n.H_REPLAYED, str(msg.offset()).encode()),
                                       (n.H_ORIGIN, parcel.origin.encode())]))
        assert self.client is not None
        outcomes = submit(self.client, entries, self.stop)
        immediate, actions = resolutions(handoff, entries, outcomes)
        results = iter(hand_off(handoff, actions, self.stop, f"dlq replay {self.name}"))
        if not self.options.only.selective:
            self._commit(batch[-1].offset() + 1)
        for first in immediate:
            what = first or next(results)
            r = self.report
            r.ok += what == "ok"
            r.retried += what == "retry"
            r.dead_lettered += what == "dead_letter"
        self.report.replayed += len(batch)
        self.report.offsets.extend(m.offset() for m in batch)
        return outcomes

    def _commit(self, offset: int) -> None:
        tp = TopicPartition(self.tp.topic, self.tp.partition, offset)
        try:
            self.consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:
            raise AsynctierError(f"could not save the replay position ({exc.args[0].str()}); "
                                 "the last batch will be replayed again next time") from exc
        self.report.next_offset = offset


def replay(settings: Settings, binding: str, options: ReplayOptions,
           client: SchedulerClient | None = None, stop: threading.Event | None = None,
           progress: Progress | None = None) -> ReplayReport:
    """Replay ``binding``'s dead letters (see the module docstring); returns the report."""
    return Replay(settings, binding, options, client, stop, progress).run()
