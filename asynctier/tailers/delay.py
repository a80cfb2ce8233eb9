"""Delay tailers: what brings retried records back from the delay topics.

One consumer group per delay topic (``<prefix>.delay.<interval>``), one consumer thread per
interval. A record is never released before its broker timestamp + the topic's interval:
when a partition's head is not due, that partition is paused and sought back to the head,
and resumed when the head is due, while the other partitions keep flowing. The consume
timeout is bounded by the nearest resume time: no busy polling, no sleeping consumer.

A released record whose ``asynctier.due`` is still ahead hops into the next delay topic;
otherwise it goes to the scheduler with the attempt number its header carries, and its
outcome is resolved exactly as the main tailer resolves one (:class:`Handoff`). A record
whose binding no longer exists goes to that binding's dead-letter topic (reason
``binding_removed``). Offsets are committed, per partition highest released + 1, only
after every hand-off of the batch was confirmed.

The delay path needs only Kafka (and a scheduler). Redis is touched for a ``--ordering key``
binding (a record of it that succeeds or becomes a dead letter unparks its key,
:class:`~asynctier.tailers.key_order.KeyHeads`, before the batch is committed) and for the
paused bindings, read every second: a due record of a paused binding goes back to its
ladder's first delay topic, attempt unspent. Without Redis the last pauses read hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from asynctier.delay_streams.bookkeeping import (
    BindingBook,
    existing_delay_intervals,
    ladder_intervals,
)
from asynctier.delay_streams.handoff import (
    Handoff,
    Parcel,
    parcel_from_message,
    platform_header,
)
from asynctier.delay_streams.pauses import PauseBook, release_at_ms
from asynctier.delay_streams.release import Action, Entry, make_entry
from asynctier.delay_streams.topics import dlq_topic_config, ensure_binding_topics
from asynctier.platform import metrics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding, is_binding_name
from asynctier.platform.calls import CallBuilder
from asynctier.platform.config import Settings
from asynctier.platform.durations import epoch_ms, format_duration
from asynctier.platform.errors import AsynctierError, HandoffError, SchedulerUnavailable
from asynctier.platform.kafka import (
    admin,
    close_consumer,
    commit_past,
    consume_error,
    ensure_topics,
    leave_group,
    tailer_consumer_config,
    topic_replication,
)
from asynctier.platform.membership import default_client
from asynctier.platform.paused import PauseFollower
from asynctier.platform.registry import RegistryFollower
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.signals import wait_for_stop
from asynctier.platform.supervise import Supervisor
from asynctier.platform.wire import BINDING_REMOVED
from asynctier.tailers.key_order import KeyHeads, Unpark
from asynctier.tailers.options import PipelineOptions
from asynctier.tailers.parking import ParkingLot
from asynctier.tailers.partitions import Partitions
from asynctier.tailers.pipeline import Hook, Pipeline, no_hook
from asynctier.tailers.source import TP, Batch, Prepared, high_marks

log = logging.getLogger(__name__)

#: A paused binding's held retries are said in the log at most this often.
HELD_LOG_EVERY_MS = 60_000

COMPONENT = "delay"
#: Dead-letter reason of a record whose binding was removed while it waited.
#: Dead-letter "binding" of a delay record that names no binding at all.
UNBOUND = "_unbound"
#: How long the broker may hold a fetch for more records: the delay path has time.
FETCH_WAIT_MAX_MS = 100
#: Records the client queues ahead of a delay tailer, in KiB (a due topic drains fast).
QUEUED_MAX_KBYTES = 16384
#: How long a new session waits for its delay topic to exist (made by ``bind``) before
#: subscribing anyway, how long one metadata request may take, and the pause between two.
TOPIC_WAIT_S = 30.0
TOPIC_METADATA_S = 5.0
TOPIC_RETRY_S = 0.2
#: How long stopping waits for the delay tailers in all.
JOIN_S = 120.0


@dataclass
class DelayOptions(PipelineOptions):
    """Knobs of the delay tailers."""

    batch_size: int = 500
    idle_poll_s: float = 1.0
    longest_wait_s: float = 1.0
    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 960_000
    ready_timeout_s: float = 30.0


def _due_ms(msg: Any) -> int:
    raw = platform_header(msg, n.H_DUE)
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0


def consumer_config(settings: Settings, group: str, options: DelayOptions) -> dict[str, Any]:
    """A delay tailer's consumer (see :func:`tailer_consumer_config`)."""
    return tailer_consumer_config(settings, group,
                                  session_timeout_ms=options.session_timeout_ms,
                                  max_poll_interval_ms=options.max_poll_interval_ms,
                                  fetch_wait_max_ms=FETCH_WAIT_MAX_MS,
                                  queued_max_kbytes=QUEUED_MAX_KBYTES)


@dataclass
class Released:
    """What a delay batch keeps: the records sent to the scheduler (as entries), the
    actions of those resolved here (hops, dead letters), and, once handed off, what became
    of its records per (binding, tenant), for the metrics."""

    entries: list[Entry]
    actions: list[Action]
    by_binding: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)


class DelaySource:
    """One delay topic as a :class:`~asynctier.tailers.source.Source`: releases records
    that are due, hops those that are not due yet, dead-letters those whose binding is
    gone, and commits (synchronously) per partition highest released + 1."""

    def __init__(self, tailer: DelayTailer, consumer: Any) -> None:
        self.tailer = tailer
        self.consumer = consumer
        self.what = f"delay {tailer.interval}"
        self.topic = tailer.topic
        self.handoff = tailer.handoff
        self.heads = tailer.heads

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """Resume the partitions whose head is due, then consume; a record that is not due
        pauses its partition (and is read again after the resume)."""
        tailer, consumer = self.tailer, self.consumer
        due = tailer.pauses.take_due(epoch_ms())
        if due:
            consumer.resume([TopicPartition(tailer.topic, p) for p in due])
        if wait_s > 0:
            wait_s = tailer.pauses.wait_s(epoch_ms(), min(wait_s, tailer.options.longest_wait_s))
            first = consumer.consume(1, wait_s)
            got = [*first, *consumer.consume(max_records - 1, 0)] if first else []
        else:
            got = consumer.consume(max_records, 0)
        return tailer.sort(consumer, got)

    def prepare(self, records: list[Any]) -> Prepared[Released]:
        """Records due go to the scheduler (first in the batch); the others are resolved
        here: a hop to the next delay topic, or a dead letter when the binding is gone."""
        tailer = self.tailer
        records = [m for m in records if (m.topic(), m.partition()) in tailer.owned]
        now = epoch_ms()
        call = CallBuilder()
        sent: list[Any] = []
        entries: list[Entry] = []
        local: list[tuple[Any, Action]] = []
        for at, msg in enumerate(records):
            parcel = parcel_from_message(msg, now_ms=msg.timestamp()[1])
            name = (platform_header(msg, n.H_BINDING) or b"").decode("utf-8", "replace")
            possible = is_binding_name(name)  # else: no registry read, the catch-all
            binding = tailer.bindings.get(name) if possible else None
            if binding is None:
                local.append((msg, tailer.orphan(name if possible else UNBOUND, parcel)))
            elif parcel.due_ms > now:
                local.append((msg, tailer.hop(binding, parcel)))
            elif name in tailer.bindings.paused:
                local.append((msg, tailer.hold(binding, parcel, now)))
            else:
                # the record's origin: every copy of one record is one record to the
                # scheduler (its run-once key and its quota charge)
                entry = make_entry(len(entries), binding, parcel, parcel.origin)
                item = entry.item
                if not call.add(item["binding"], item["payload"], item["key"],
                                parcel.headers, item["attempt"], item["source_ref"],
                                item["record_time_ms"]):
                    return self._prepared(sent, entries, local, call, records[at:])
                sent.append(msg)
                entries.append(entry)
        return self._prepared(sent, entries, local, call, [])

    @staticmethod
    def _prepared(sent: list[Any], entries: list[Entry], local: list[tuple[Any, Action]],
                  call: CallBuilder, rest: list[Any]) -> Prepared[Released]:
        records = sent + [msg for msg, _ in local]
        return Prepared(records, call.encode() if sent else None,
                        Released(entries, [action for _, action in local]),
                        high_marks(records), rest, len(sent))

    def wait(self, batch: Batch[Released], superseded: Callable[[], bool]) -> bool:
        """The delay consumer's poll interval is long (16 min): no need to poll meanwhile."""
        return True

    def hand_off(self, batch: Batch[Released]) -> Counter[str]:
        """Resolve the scheduler's outcomes, then the hops and dead letters of the batch."""
        released = batch.extra
        counts: Counter[str] = Counter()
        by_binding: dict[tuple[str, str], Counter[str]] = {}
        by_id = {o["id"]: o for o in batch.outcomes}
        unpark: Unpark = {}
        for i, entry in enumerate(released.entries):
            what = self.heads.resolve(self.handoff, entry.binding, entry.parcel, by_id[i],
                                      unpark)
            by_binding.setdefault((entry.binding.name, entry.binding.tenant), Counter())[
                what] += 1
            counts[what] += 1
        for action in released.actions:
            counts[action()] += 1
        self.heads.release(unpark)
        released.by_binding = by_binding
        return counts

    def confirm(self) -> None:
        """Every hop, retry and dead letter so far delivered, or HandoffError."""
        self.handoff.confirm()

    def checkpoint(self, batch: Batch[Released], sync: bool) -> None:
        """Commit (synchronously: the delay path has time) past the highest released
        offset of each owned partition."""
        owned = self.tailer.owned
        commit_past(self.consumer, batch.mark, lambda t, p: (t, p) in owned, True,
                    self.what)

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """Nothing: every commit was synchronous."""

    def counted(self, batch: Batch[Released]) -> None:
        """Outcomes per binding, and the batch, in the metrics."""
        for (name, tenant), counts in batch.extra.by_binding.items():
            metrics.record_outcomes(name, tenant, counts)
            metrics.count_batch(COMPONENT, name)
        self.tailer.stats.update(batch.counts)


class DelayTailer:
    """Tails the delay topic of one interval in the group ``<prefix>.delay.<interval>``."""

    def __init__(self, settings: Settings, interval_s: float, bindings: BindingBook,
                 client: SchedulerClient, options: DelayOptions | None = None, *,
                 consumer_factory: Callable[[dict[str, Any]], Any] = Consumer,
                 handoff: Handoff | None = None, hook: Hook = no_hook) -> None:
        self.settings = settings
        self.hook = hook
        self.interval = format_duration(interval_s)
        self.interval_ms = round(interval_s * 1000)
        self.topic = settings.names.delay_topic(self.interval)
        self.group = settings.names.delay_group(self.interval)
        self.bindings = bindings
        self.client = client
        self.options = options or DelayOptions()
        self.handoff = handoff or Handoff(settings)
        self.pauses = PauseBook()
        self.assigned = threading.Event()
        self.stats: Counter[str] = Counter()
        self._held_said: dict[str, int] = {}  # binding -> when its hold was last logged
        self.partitions = Partitions(f"delay {self.interval}")
        self.partitions.listen(assigned=self._assigned, gone=self._gone)
        self.owned = self.partitions.owned  # only these are released and committed
        self.on_assign = self.partitions.on_assign
        self.on_revoke = self.partitions.on_revoke
        self.on_lost = self.partitions.on_lost
        self._dlq_ready: set[str] = set()
        self._consumer_factory = consumer_factory
        self._consumer: Any = None  # this session's
        self.pipeline: Pipeline[Released] | None = None
        self.heads = KeyHeads(settings)

    def lot(self, binding: str) -> ParkingLot:
        """The parked keys of a ``--ordering key`` binding (made when first needed)."""
        return self.heads.lot(binding)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tail until ``stop`` is set; the batches under way are finished and committed.
        A failure raises: its supervisor (:class:`DelayService`) starts a new session,
        from the last committed offsets."""
        try:
            self._session(stop)
        except (SchedulerUnavailable, HandoffError) as exc:
            if not stop.is_set():
                raise
            log.warning("delay %s: stopping with a batch unresolved (%s); its records "
                        "will be read again (not committed)", self.interval, exc)

    def open(self) -> Pipeline[Released]:
        """A new session: its consumer, source and pipeline (not subscribed yet)."""
        consumer = self._consumer_factory(consumer_config(self.settings, self.group,
                                                          self.options))
        self.pauses = PauseBook()
        self.partitions.start(consumer)
        self._consumer = consumer
        self.pipeline = Pipeline(DelaySource(self, consumer), self.client, COMPONENT,
                                 self.interval, self.options, self.hook)
        self.partitions.pipeline = self.pipeline
        return self.pipeline

    def _session(self, stop: threading.Event) -> None:
        pipeline = self.open()
        consumer = self._consumer
        self._wait_for_topic(consumer, stop)
        consumer.subscribe([self.topic], on_assign=self.on_assign,
                           on_revoke=self.on_revoke, on_lost=self.on_lost)
        log.info("delay tailer %s started: topic %s, group %s", self.interval, self.topic,
                 self.group)
        try:
            pipeline.run(stop)
        finally:
            what = f"delay tailer {self.interval}"
            leave_group(consumer, lambda: bool(self.owned), what)
            close_consumer(consumer.close, what)
            metrics.set_in_flight(COMPONENT, self.interval, 0)
            log.info("delay tailer %s stopped", self.interval)

    def _wait_for_topic(self, consumer: Any, stop: threading.Event) -> None:
        deadline = time.monotonic() + TOPIC_WAIT_S
        while not stop.is_set() and time.monotonic() < deadline:
            meta = consumer.list_topics(self.topic, timeout=TOPIC_METADATA_S).topics.get(
                self.topic)
            if meta is not None and meta.error is None and meta.partitions:
                return
            stop.wait(TOPIC_RETRY_S)

    def sort(self, consumer: Any, messages: list[Any]) -> list[Any]:
        """The messages that may leave now; the partition of one that may not is paused."""
        now = epoch_ms()
        released = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                consume_error(err, f"delay {self.interval}", self.topic)
                continue
            if (msg.topic(), msg.partition()) not in self.owned:
                continue  # revoked or lost while it was read: its new owner releases it
            if self.pauses.is_paused(msg.partition()):
                continue  # behind a head that is not due: read again after the resume
            at = release_at_ms(msg.timestamp()[1], self.interval_ms, _due_ms(msg))
            if at > now:
                self._hold(consumer, msg, at)
            else:
                released.append(msg)
        return released

    def _hold(self, consumer: Any, msg: Any, until_ms: int) -> None:
        """Pause the message's partition and seek it back so the head is read again."""
        tp = TopicPartition(self.topic, msg.partition(), msg.offset())
        consumer.pause([tp])
        consumer.seek(tp)  # raises on failure: the session restarts from committed offsets
        self.pauses.pause(msg.partition(), until_ms)

    # -- what is resolved here ------------------------------------------------------------

    def hop(self, binding: Binding, parcel: Parcel) -> Action:
        """A record released early for its due time: on to the next delay topic."""
        def act() -> str:
            self.handoff.delay(binding, parcel, parcel.due_ms, parcel.attempt, parcel.error)
            return "hop"
        return act

    def hold(self, binding: Binding, parcel: Parcel, now_ms: int) -> Action:
        """A due record of a paused binding: back to its ladder's first delay topic, due
        one hop later, its attempt not spent; it runs once the binding is resumed."""
        said = self._held_said.get(binding.name)
        if said is None or now_ms - said >= HELD_LOG_EVERY_MS:
            self._held_said[binding.name] = now_ms
            log.info("delay %s: binding %s is paused: its due retries go back one hop "
                     "(attempts unspent) until `asynctier resume %s`", self.interval,
                     binding.name, binding.name)

        def act() -> str:
            due_ms = now_ms + int(binding.retries.ladder_s[0] * 1000)
            self.handoff.delay(binding, parcel, due_ms, parcel.attempt, parcel.error)
            return "held"
        return act

    def orphan(self, name: str, parcel: Parcel) -> Action:
        """A record whose binding is gone: to that binding's dead-letter topic."""
        self._ensure_dlq(name)
        log.warning("delay %s: a record of binding %r (from %s) goes to the dead-letter "
                    "topic: the binding no longer exists", self.interval, name, parcel.origin)

        def act() -> str:
            self.handoff.dead_letter(name, parcel, BINDING_REMOVED,
                                     parcel.error or "binding removed",
                                     max(parcel.attempt - 1, 0))
            return BINDING_REMOVED
        return act

    def _ensure_dlq(self, name: str) -> None:
        topic = self.settings.names.dlq_topic(name)
        if topic in self._dlq_ready:
            return
        try:
            ensure_topics(admin(self.settings), {topic: (1, dlq_topic_config())},
                          replication=topic_replication(self.settings))
            self._dlq_ready.add(topic)
        except AsynctierError as exc:
            log.error("delay %s: could not create %s: %s", self.interval, topic, exc)

    # -- partitions assigned and gone (the callbacks are :class:`Partitions`') ------------

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Partitions assigned: unpaused (one paused before a revoke must not come back
        paused)."""
        self.pauses.forget([tp.partition for tp in partitions])
        if partitions:
            try:
                consumer.resume(partitions)
            except KafkaException as exc:
                log.debug("delay %s: resume on assign: %s", self.interval, exc)
        self.assigned.set()

    def _gone(self, gone: set[TP]) -> None:
        """Partitions revoked or lost: no head of theirs is waited for any more."""
        self.pauses.forget([p for _, p in gone])


# -- the service: one tailer per interval, following the bindings -------------------------


class DelayService:
    """Runs one :class:`DelayTailer` thread per interval any binding's ladder uses (and per
    delay topic that already exists), and creates the delay topics as bindings change."""

    def __init__(self, settings: Settings, client: SchedulerClient, stop: threading.Event,
                 options: DelayOptions | None = None, hook: Hook = no_hook) -> None:
        self.settings = settings
        self.hook = hook
        self.client = client
        self.stop = stop
        self.options = options or DelayOptions()
        self.bindings = BindingBook(settings)
        self.tailers: dict[str, DelayTailer] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.follower = RegistryFollower(settings, self._on_bindings)
        self.pauses = PauseFollower(settings, self.bindings.set_paused)

    def start(self) -> None:
        """Read the pauses and the bindings, create their topics, start the tailers;
        follow changes."""
        self.pauses.read_once()
        self._threads.append(Supervisor(
            "pauses", self.pauses.run, self.stop, what="the paused-bindings follower",
            hint="Pauses and resumes wait until it reads Redis again; check Redis.",
            policy=self.settings.restarts,
            on_restart=metrics.count_task_restart).start().thread)
        self.follower.start()
        self._run_intervals(existing_delay_intervals(self.settings))

    def _on_bindings(self, bindings: dict[str, Binding]) -> None:
        self.bindings.update(bindings)
        kafka = [b for b in bindings.values() if b.source.kind == "kafka"]  # a queue delays
        try:  # its own retries
            ensure_binding_topics(self.settings, kafka)
        except AsynctierError as exc:
            log.error("could not create the delay and dead-letter topics: %s", exc)
        self._run_intervals(ladder_intervals(kafka))

    def _run_intervals(self, intervals: set[float]) -> None:
        with self._lock:
            for interval_s in sorted(intervals):
                name = format_duration(interval_s)
                if name in self.tailers or self.stop.is_set():
                    continue
                tailer = DelayTailer(self.settings, interval_s, self.bindings, self.client,
                                     self.options, hook=self.hook)
                self.tailers[name] = tailer
                supervisor = Supervisor(
                    f"delay:{name}", tailer.run, self.stop, what=f"delay tailer {name}",
                    hint=f"The records of {tailer.topic} wait, nothing is lost: a new "
                         "session reads them again from the last commit. Check the broker "
                         "and the error above.",
                    policy=self.settings.restarts, on_restart=metrics.count_tailer_restart)
                self._threads.append(supervisor.start().thread)

    def wait_assigned(self, timeout_s: float) -> bool:
        """Wait until every tailer started so far had its first assignment."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            tailers = list(self.tailers.values())
        return all(t.assigned.wait(max(0.0, deadline - time.monotonic())) for t in tailers)

    def join(self, timeout_s: float = JOIN_S) -> None:
        """Stop following the bindings and wait for the tailers to finish."""
        self.follower.stop()
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        self.pauses.close()


def run_delay_tailers(settings: Settings, stop: threading.Event,
                      client: SchedulerClient | None = None,
                      ready: Callable[[], object] | None = None,
                      options: DelayOptions | None = None, hook: Hook = no_hook,
                      beat: Callable[[], None] | None = None) -> None:
    """Run the delay tailers until ``stop`` is set (``asynctier run delay``).

    - ``settings``: the process's Settings (prefix, Kafka; Redis is not needed).
    - ``stop``: set it (on SIGTERM) to stop: each tailer finishes the batch under way,
      commits it and closes its consumer; then this returns.
    - ``client``: the SchedulerClient to submit to; by default one on the live schedulers
      (closed on return; a client given is left open for its owner).
    - ``ready``: called once, with no argument, when the bindings were read, the delay
      topics created and every tailer had its first partition assignment (or after
      ``options.ready_timeout_s``). ``threading.Event().set`` fits.
    - ``options``: :class:`DelayOptions` (batch size, waits).
    - ``hook``: called at the pipeline's named points (:mod:`asynctier.dev.faults`).
    - ``beat``: called every half second while this waits (the process's liveness).

    Each tailer runs under a supervisor: one that fails is started again, a new session
    from the last committed offsets, after a bounded backoff (``settings.restarts``).
    """
    own = client is None
    client = client or default_client(settings)
    service = DelayService(settings, client, stop, options, hook)
    try:
        service.start()
        service.wait_assigned(service.options.ready_timeout_s)
        log.info("delay tailers running for %s", ", ".join(service.tailers) or "no interval yet")
        if ready is not None:
            ready()
        wait_for_stop(stop, beat)  # not an untimed wait: see MAIN_WAKE_S
    finally:
        stop.set()
        service.join()
        if own:
            client.close()
