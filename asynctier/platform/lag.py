"""Consumer lag, read from the broker alone, in records and in seconds.

Like ``kafka-consumer-groups``, nothing here needs a running platform: committed offsets
come from the group coordinator (through a consumer of the group that never joins it), end
offsets from the partition leaders, and the age of the oldest record not yet resolved from
that one record, fetched by a consumer that is assigned to the committed offset and never
joins a group or commits.

Three kinds of row, one per partition:

* ``binding``: the binding's source topic and its tailer's group ``<prefix>.<binding>``;
* ``delay``: a delay topic ``<prefix>.delay.<interval>`` and its group;
* ``dlq``: a dead-letter topic; its group is the one ``dlq replay`` commits to, so ``lag``
  is the number of dead letters not yet replayed (all of them when none ever was).

Lag is ``end - max(committed, low)``; a group that never committed counts from the low
watermark (tailers start from the earliest record). ``lag_seconds`` is ``now`` minus the
timestamp of the record at that position, 0 when the lag is 0, None when it is unknown.

:class:`LagCollector` keeps ``asynctier_consumer_lag``, ``asynctier_consumer_lag_seconds``
and ``asynctier_delay_backlog`` up to date for the bindings of one process.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import (
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.durations import parse_duration
from asynctier.platform.errors import AsynctierError
from asynctier.platform.kafka import client_config
from asynctier.platform.names import Names

log = logging.getLogger(__name__)

RowKind = Literal["binding", "delay", "dlq"]
Position = tuple[str, int]  # (topic, partition)
Spot = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True)
class LagTarget:
    """One topic read by one group: what a set of lag rows is about."""

    kind: RowKind
    name: str  # the binding's name, or the delay interval such as ``30s``
    group: str
    topic: str


@dataclass(frozen=True)
class LagRow:
    """The lag of one group on one partition."""

    kind: RowKind
    name: str
    group: str
    topic: str
    partition: int
    committed: int | None
    low: int
    end: int
    lag: int
    lag_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready values."""
        return asdict(self)


def row_of(target: LagTarget, partition: int, committed: int | None, low: int, end: int,
           record_ms: int | None, now_s: float) -> LagRow:
    """Compute one row from offsets and the timestamp of the record at the start position."""
    start = low if committed is None else max(committed, low)
    lag = max(0, end - start)
    if lag == 0:
        seconds: float | None = 0.0
    elif record_ms is None or record_ms < 0:
        seconds = None
    else:
        seconds = max(0.0, now_s - record_ms / 1000.0)
    return LagRow(target.kind, target.name, target.group, target.topic, partition,
                  committed, low, end, lag, seconds)


def start_offset(committed: int | None, low: int) -> int:
    """The first record a group has not resolved: its committed offset, or the low
    watermark when it never committed or retention removed what it points at."""
    return low if committed is None else max(committed, low)


# --- what to look at ------------------------------------------------------------------


def delay_intervals(names: Names, topics: Iterable[str]) -> list[str]:
    """The intervals of the delay topics among ``topics``, shortest first."""
    head = names.delay_topic("")
    found = []
    for topic in topics:
        if topic.startswith(head):
            interval = topic[len(head):]
            try:
                found.append((parse_duration(interval), interval))
            except ValueError:
                continue
    return [interval for _, interval in sorted(found)]


def binding_targets(names: Names, bindings: Iterable[Binding]) -> list[LagTarget]:
    """The source-topic target of each Kafka binding (a queue's backlog is the queue's)."""
    return [LagTarget("binding", b.name, names.group(b.name), b.source.topic) for b in bindings
            if b.source.kind == "kafka"]


def delay_targets(names: Names, intervals: Iterable[str]) -> list[LagTarget]:
    """The target of each delay topic."""
    return [LagTarget("delay", i, names.delay_group(i), names.delay_topic(i))
            for i in intervals]


def dlq_targets(names: Names, bindings: Iterable[Binding]) -> list[LagTarget]:
    """The dead-letter target of each binding (group: the replay group)."""
    return [LagTarget("dlq", b.name, names.dlq_replay_group(b.name), names.dlq_topic(b.name))
            for b in bindings]


def targets_for(names: Names, bindings: Iterable[Binding], topics: Iterable[str],
                only: str | None = None) -> list[LagTarget]:
    """Every target of ``bindings`` whose topic exists among ``topics``.

    With ``only``, that binding and the delay topics of its ladder; otherwise every
    delay topic on the broker.
    """
    chosen = [b for b in bindings if only is None or b.name == only]
    present = set(topics)
    intervals = delay_intervals(names, present)
    if only is not None:
        ladder = {name for b in chosen for name in b.retries.ladder_names}
        intervals = [i for i in intervals if i in ladder]
    wanted = (binding_targets(names, chosen) + delay_targets(names, intervals)
              + dlq_targets(names, chosen))
    return [t for t in wanted if t.topic in present]


# --- reading the broker ---------------------------------------------------------------


def _retriable(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and bool(err.retriable())


class LagReader:
    """Reads end offsets with the admin client, committed offsets with a consumer per
    group (never subscribed) and record times with a consumer of a group of its own.

    Keeps both clients open between calls (close with :meth:`close`) and remembers the
    timestamp of the record at each partition's start position, so a steady group costs
    no fetch at all.
    """

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._admin = AdminClient(client_config(settings))
        self._consumer: _Consumer | None = None
        self._times: dict[Spot, int] = {}  # record time (ms) at (topic, partition, offset)
        self._groups: dict[str, _Consumer] = {}  # committed offsets, one consumer per group

    def topics(self) -> dict[str, int]:
        """Every topic on the broker and its partition count."""
        try:
            md = self._admin.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise AsynctierError(f"cannot read topic metadata from "
                                 f"{self.settings.kafka_bootstrap}: {exc.args[0]}") from exc
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

    def read(self, targets: Sequence[LagTarget], partitions: Mapping[str, int] | None = None,
             now_s: float | None = None) -> list[LagRow]:
        """The rows of every partition of every target."""
        parts = self.topics() if partitions is None else partitions
        pairs = [(t, p) for t in targets for p in range(parts.get(t.topic, 0))]
        marks = self.watermarks(sorted({(t.topic, p) for t, p in pairs}))
        committed = {t: self.committed(t.group, t.topic, parts.get(t.topic, 0))
                     for t in dict.fromkeys(targets)}
        starts = {(t, p): start_offset(committed[t][p], marks[(t.topic, p)][0])
                  for t, p in pairs}
        times = self.record_times({(t.topic, p, off) for (t, p), off in starts.items()
                                   if off < marks[(t.topic, p)][1]})
        now = time.time() if now_s is None else now_s
        return [row_of(t, p, committed[t][p], *marks[(t.topic, p)],
                       times.get((t.topic, p, starts[(t, p)])), now)
                for t, p in pairs]

    def watermarks(self, positions: Sequence[Position]) -> dict[Position, tuple[int, int]]:
        """``(low, end)`` of each partition."""
        if not positions:
            return {}
        low = self._list_offsets(positions, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        end = self._list_offsets(positions, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return {pos: (low[pos], end[pos]) for pos in positions}

    def _list_offsets(self, positions: Sequence[Position], spec: Any) -> dict[Position, int]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                futures = self._admin.list_offsets(
                    {TopicPartition(t, p): spec for t, p in positions},
                    request_timeout=self.timeout_s)
                return {(tp.topic, tp.partition): int(f.result().offset)
                        for tp, f in futures.items()}
            except KafkaException as exc:
                if not _retriable(exc) or time.monotonic() > deadline:
                    raise AsynctierError(f"cannot list offsets: {exc.args[0]}") from exc
                time.sleep(0.2)

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int | None]:
        """The committed offset of ``group`` on each partition (None: never committed).

        Read by a consumer of ``group`` that never subscribes (so never joins it or
        commits), not by the admin client: librdkafka's admin ListConsumerGroupOffsets
        dereferences a NULL consumer group and kills the process with SIGSEGV when the
        coordinator answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, as it does
        for a group never seen on a young broker (confluentinc/librdkafka#5040)."""
        if partitions == 0:
            return {}
        try:
            found = self._group_reader(group).committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=self.timeout_s)
        except KafkaException as exc:
            raise AsynctierError(f"cannot read the offsets of group {group}: "
                                 f"{exc.args[0]}") from exc
        out: dict[int, int | None] = dict.fromkeys(range(partitions))
        for tp in found:
            if tp.error is not None:
                raise AsynctierError(f"cannot read the offset of group {group} on "
                                     f"{topic}[{tp.partition}]: {tp.error}")
            out[tp.partition] = None if tp.offset < 0 else int(tp.offset)
        return out

    def _group_reader(self, group: str) -> _Consumer:
        consumer = self._groups.get(group)
        if consumer is None:
            consumer = self._groups[group] = _Consumer(self.settings.kafka_config(**{
                "group.id": group, "enable.auto.commit": False,
                "enable.auto.offset.store": False}))
        return consumer

    def record_times(self, wanted: Iterable[Spot]) -> dict[Spot, int | None]:
        """The timestamp (epoch ms) of the first record at or after each (topic, partition,
        offset). Times found are remembered until a pass no longer asks for them."""
        spots = list(wanted)
        known = {spot: self._times[spot] for spot in spots if spot in self._times}
        missing = [spot for spot in spots if spot not in known]
        found: dict[Spot, int | None] = {}
        while missing:  # a consumer reads one offset per partition at a time
            batch: dict[Position, int] = {}
            rest = []
            for topic, p, off in missing:
                if (topic, p) in batch:
                    rest.append((topic, p, off))
                else:
                    batch[(topic, p)] = off
            for (topic, p), ms in self._fetch_times(batch).items():
                found[(topic, p, batch[(topic, p)])] = ms
            missing = rest
        self._times = {**known, **{k: v for k, v in found.items() if v is not None}}
        return {**known, **found}

    def _fetch_times(self, wanted: Mapping[Position, int]) -> dict[Position, int | None]:
        consumer = self._reader()
        consumer.assign([TopicPartition(t, p, off) for (t, p), off in wanted.items()])
        found: dict[Position, int | None] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(found) < len(wanted) and time.monotonic() < deadline:
                for msg in consumer.consume(len(wanted), 0.2):
                    _note_time(msg, wanted, found)
        finally:
            consumer.unassign()
        for pos in wanted:
            found.setdefault(pos, None)
        return found

    def _reader(self) -> _Consumer:
        if self._consumer is None:
            self._consumer = _Consumer(self.settings.kafka_config(**{
                "group.id": f"{self.settings.prefix}.lag-reader.{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "max.partition.fetch.bytes": 65536,
                "queued.max.messages.kbytes": 1024,
            }))
        return self._consumer

    def close(self) -> None:
        """Close the consumers (the admin client needs no closing)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        for consumer in self._groups.values():
            consumer.close()
        self._groups.clear()


def _note_time(msg: Any, wanted: Mapping[Position, int],
               found: dict[Position, int | None]) -> None:
    pos = (msg.topic(), msg.partition())
    if pos in found or pos not in wanted:
        return
    err = msg.error()
    if err is not None:
        if err.code() == KafkaError._PARTITION_EOF:
            found[pos] = None
        return
    if msg.offset() >= wanted[pos]:
        _kind, ms = msg.timestamp()
        found[pos] = int(ms) if ms >= 0 else None


def read_lag(settings: Settings, bindings: Iterable[Binding], only: str | None = None,
             reader: LagReader | None = None,
             partitions: Mapping[str, int] | None = None) -> list[LagRow]:
    """Every lag row of ``bindings`` (and of the delay topics), read from the broker.

    ``partitions`` (topic -> partition count) saves a metadata request when known.
    """
    own = reader is None
    lag_reader = reader or LagReader(settings)
    try:
        parts = lag_reader.topics() if partitions is None else partitions
        targets = targets_for(settings.names, bindings, parts, only)
        return lag_reader.read(targets, parts)
    finally:
        if own:
            lag_reader.close()


# --- exporting ------------------------------------------------------------------------


def export_rows(rows: Iterable[LagRow]) -> set[tuple[str, str, int]]:
    """Set the lag gauges (and the delay backlog) from ``rows``; return the series set."""
    series: set[tuple[str, str, int]] = set()
    backlog: dict[str, int] = {}
    for row in rows:
        if row.kind == "dlq":
            continue
        seconds = row.lag_seconds if row.lag_seconds is not None else float("nan")
        metrics.set_consumer_lag(row.group, row.topic, row.partition, row.lag, seconds)
        series.add((row.group, row.topic, row.partition))
        if row.kind == "delay":
            backlog[row.topic] = backlog.get(row.topic, 0) + row.lag
    for topic, n in backlog.items():
        metrics.set_delay_backlog(topic, n)
    return series


class LagCollector:
    """Keeps the lag gauges of one process's bindings fresh from a daemon thread.

    ``bindings`` is asked for the current bindings at each pass (a tailer process passes
    its RegistryFollower's view); with ``delay=True`` the delay topics are covered too
    (the delay process). Series of partitions that went away are dropped.
    """

    def __init__(self, settings: Settings, bindings: Callable[[], Mapping[str, Binding]],
                 *, include_bindings: bool = True, delay: bool = False,
                 interval_s: float = 15.0) -> None:
        self.settings = settings
        self.bindings = bindings
        self.include_bindings = include_bindings
        self.delay = delay
        self.interval_s = interval_s
        self._reader = LagReader(settings)
        self._series: set[tuple[str, str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def targets(self, topics: Iterable[str]) -> list[LagTarget]:
        """What this process exports: its bindings' source topics and/or the delay topics."""
        names, present = self.settings.names, set(topics)
        wanted: list[LagTarget] = []
        if self.include_bindings:
            wanted += binding_targets(names, self.bindings().values())
        if self.delay:
            wanted += delay_targets(names, delay_intervals(names, present))
        return [t for t in wanted if t.topic in present]

    def update(self) -> list[LagRow]:
        """One pass: read the broker, set the gauges, drop vanished series."""
        parts = self._reader.topics()
        rows = self._reader.read(self.targets(parts), parts)
        series = export_rows(rows)
        for gone in self._series - series:
            metrics.forget_consumer_lag(*gone)
        self._series = series
        return rows

    def start(self) -> None:
        """Update now and then every ``interval_s`` in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="lag-collector", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.update()
            except Exception:  # the broker may be away; the next pass tries again
                log.warning("consumer lag could not be read; will retry", exc_info=True)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop the thread and close the reader."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + self._reader.timeout_s)
        self._reader.close()
