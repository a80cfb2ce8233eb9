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

The delay path needs only Kafka (and a scheduler): Redis is never touched here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from asynctier.delay_streams.bookkeeping import (
    BindingBook,
    existing_delay_intervals,
    ladder_intervals,
)
from asynctier.delay_streams.handoff import Handoff, Parcel, parcel_from_message
from asynctier.delay_streams.pauses import PauseBook, release_at_ms
from asynctier.delay_streams.release import Action, Entry, hand_off, make_entry, resolutions
from asynctier.delay_streams.release import submit as submit_entries
from asynctier.delay_streams.topics import dlq_topic_config, ensure_binding_topics
from asynctier.platform import metrics
from asynctier.platform import names as n
from asynctier.platform.binding import Binding, is_binding_name
from asynctier.platform.config import Settings
from asynctier.platform.durations import format_duration
from asynctier.platform.errors import AsynctierError, HandoffError, SchedulerUnavailable
from asynctier.platform.kafka import (
    admin,
    close_consumer,
    ensure_topics,
    leave_group,
    tailer_consumer_config,
    take_over,
)
from asynctier.platform.registry import RegistryFollower
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.scheduler.membership import SchedulerDirectory
from asynctier.platform.signals import wait_for_stop

log = logging.getLogger(__name__)

COMPONENT = "delay"
#: Dead-letter reason of a record whose binding was removed while it waited.
BINDING_REMOVED = "binding_removed"
#: Dead-letter "binding" of a delay record that names no binding at all.
UNBOUND = "_unbound"


@dataclass
class DelayOptions:
    """Knobs of the delay tailers."""

    batch_size: int = 500
    longest_wait_s: float = 1.0
    handoff_retry_s: float = 1.0
    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 960_000
    ready_timeout_s: float = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _header(msg: Any, name: str) -> bytes | None:
    """The value of header ``name``; the last one when a producer wrote it more than once,
    as :func:`parcel_from_message` reads it (the release time and the record handed on
    must follow the same header)."""
    found = None
    for key, value in msg.headers() or ():
        if key == name:
            found = value
    return found


def _due_ms(msg: Any) -> int:
    raw = _header(msg, n.H_DUE)
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0


def consumer_config(settings: Settings, group: str, options: DelayOptions) -> dict[str, Any]:
    """A delay tailer's consumer (see :func:`tailer_consumer_config`)."""
    return tailer_consumer_config(settings, group,
                                  session_timeout_ms=options.session_timeout_ms,
                                  max_poll_interval_ms=options.max_poll_interval_ms,
                                  fetch_wait_max_ms=100, queued_max_kbytes=16384)


class DelayTailer:
    """Tails the delay topic of one interval in the group ``<prefix>.delay.<interval>``."""

    def __init__(self, settings: Settings, interval_s: float, bindings: BindingBook,
                 client: SchedulerClient, options: DelayOptions | None = None) -> None:
        self.settings = settings
        self.interval = format_duration(interval_s)
        self.interval_ms = round(interval_s * 1000)
        self.topic = settings.names.delay_topic(self.interval)
        self.group = settings.names.delay_group(self.interval)
        self.bindings = bindings
        self.client = client
        self.options = options or DelayOptions()
        self.handoff = Handoff(settings)
        self.pauses = PauseBook()
        self.assigned = threading.Event()
        self.stats: Counter[str] = Counter()
        # assigned, neither revoked nor lost: only these are released and committed
        self._owned: set[int] = set()
        self._dlq_ready: set[str] = set()
        self._consumer: Consumer | None = None  # this session's

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tail until ``stop`` is set; the batch under way is finished and committed."""
        while not stop.is_set():
            try:
                self._session(stop)
            except (SchedulerUnavailable, HandoffError) as exc:
                log.warning("delay %s: stopping with a batch unresolved (%s); its records "
                            "will be read again (not committed)", self.interval, exc)
                return
            except Exception:
                log.exception("delay %s: the tailer failed; starting it again from the last "
                              "committed offsets", self.interval)
                stop.wait(1.0)

    def _session(self, stop: threading.Event) -> None:
        consumer = Consumer(consumer_config(self.settings, self.group, self.options))
        self.pauses = PauseBook()
        self._owned = set()
        self._consumer = consumer
        self._wait_for_topic(consumer, stop)
        consumer.subscribe([self.topic], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("delay tailer %s started: topic %s, group %s", self.interval, self.topic,
                 self.group)
        try:
            while not stop.is_set():
                self._step(consumer, stop)
        finally:
            what = f"delay tailer {self.interval}"
            leave_group(consumer, lambda: bool(self._owned), what)
            close_consumer(consumer.close, what)
            log.info("delay tailer %s stopped", self.interval)

    def _wait_for_topic(self, consumer: Consumer, stop: threading.Event) -> None:
        deadline = time.monotonic() + 30.0
        while not stop.is_set() and time.monotonic() < deadline:
            meta = consumer.list_topics(self.topic, timeout=5.0).topics.get(self.topic)
            if meta is not None and meta.error is None and meta.partitions:
                return
            stop.wait(0.2)

    def _step(self, consumer: Consumer, stop: threading.Event) -> None:
        due = self.pauses.take_due(_now_ms())
        if due:
            consumer.resume([TopicPartition(self.topic, p) for p in due])
        wait_s = self.pauses.wait_s(_now_ms(), self.options.longest_wait_s)
        released = self._sort(consumer, self._poll(consumer, wait_s))
        if released:
            self._release(consumer, released, stop)

    def _poll(self, consumer: Consumer, wait_s: float) -> list[Any]:
        """Block until the first message (or ``wait_s``), then take what is already there:
        ``consume(n, t)`` alone would wait the whole ``t`` for ``n`` messages."""
        first = consumer.consume(1, wait_s)
        if not first:
            return []
        return [*first, *consumer.consume(self.options.batch_size - 1, 0)]

    def _sort(self, consumer: Consumer, messages: list[Any]) -> list[Any]:
        """The messages that may leave now; the partition of one that may not is paused."""
        now = _now_ms()
        released = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._consume_error(err)
                continue
            if msg.partition() not in self._owned:
                continue  # revoked or lost while it was read: its new owner releases it
            if self.pauses.is_paused(msg.partition()):
                continue  # behind a head that is not due: read again after the resume
            at = release_at_ms(msg.timestamp()[1], self.interval_ms, _due_ms(msg))
            if at > now:
                self._hold(consumer, msg, at)
            else:
                released.append(msg)
        return released

    def _hold(self, consumer: Consumer, msg: Any, until_ms: int) -> None:
        """Pause the message's partition and seek it back so the head is read again."""
        tp = TopicPartition(self.topic, msg.partition(), msg.offset())
        consumer.pause([tp])
        consumer.seek(tp)  # raises on failure: the session restarts from committed offsets
        self.pauses.pause(msg.partition(), until_ms)

    def _consume_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        log.error("delay %s: consume error on %s: %s", self.interval, self.topic, err.str())
        if err.fatal():
            raise KafkaException(err)

    # -- releasing ------------------------------------------------------------------------

    def _release(self, consumer: Consumer, messages: list[Any], stop: threading.Event) -> None:
        now = _now_ms()
        entries: list[Entry] = []
        actions: list[Action] = []
        for msg in messages:
            parcel = parcel_from_message(msg, now_ms=msg.timestamp()[1])
            name = (_header(msg, n.H_BINDING) or b"").decode("utf-8", "replace")
            possible = is_binding_name(name)  # else: no registry read, the catch-all
            binding = self.bindings.get(name) if possible else None
            if binding is None:
                actions.append(self._orphan(name if possible else UNBOUND, parcel))
            elif parcel.due_ms > now:
                actions.append(self._hop(binding, parcel))
            else:
                # the record's origin: every copy of one record is one record to the
                # scheduler (its run-once key and its quota charge)
                entries.append(make_entry(len(entries), binding, parcel, parcel.origin))
        outcomes = submit_entries(self.client, entries, stop)
        immediate, resolving = resolutions(self.handoff, entries, outcomes)
        results = hand_off(self.handoff, [*actions, *resolving], stop,
                           f"delay {self.interval}", self.options.handoff_retry_s)
        self._commit(consumer, messages)
        self._count(entries, immediate, results[len(actions):], results[:len(actions)])

    def _hop(self, binding: Binding, parcel: Parcel) -> Action:
        def act() -> str:
            self.handoff.delay(binding, parcel, parcel.due_ms, parcel.attempt, parcel.error)
            return "hop"
        return act

    def _orphan(self, name: str, parcel: Parcel) -> Action:
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
            ensure_topics(admin(self.settings), {topic: (1, dlq_topic_config())})
            self._dlq_ready.add(topic)
        except AsynctierError as exc:
            log.error("delay %s: could not create %s: %s", self.interval, topic, exc)

    def _commit(self, consumer: Consumer, messages: list[Any]) -> None:
        high: dict[int, int] = {}
        for msg in messages:
            high[msg.partition()] = max(high.get(msg.partition(), -1), msg.offset())
        offsets = [TopicPartition(self.topic, p, o + 1) for p, o in high.items()
                   if p in self._owned]
        if not offsets:
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("delay %s: commit of %s failed (%s); those records will be read "
                        "again", self.interval,
                        ", ".join(f"{t.partition}@{t.offset}" for t in offsets),
                        exc.args[0].str())

    def _count(self, entries: list[Entry], immediate: list[str], resolved: list[str],
               other: list[str]) -> None:
        it = iter(resolved)
        by_binding: dict[tuple[str, str], Counter[str]] = {}
        for entry, first in zip(entries, immediate, strict=True):
            what = first or next(it)
            key = (entry.binding.name, entry.binding.tenant)
            by_binding.setdefault(key, Counter())[what] += 1
            self.stats[what] += 1
        self.stats.update(other)
        for (name, tenant), counts in by_binding.items():
            metrics.record_outcomes(name, tenant, counts)
            metrics.count_batch(COMPONENT, name)

    # -- rebalancing ----------------------------------------------------------------------

    def _stale(self, consumer: Consumer) -> bool:
        """A callback of an earlier session's consumer (one whose ``close()`` was given up
        and returned late): it must not touch this session's partitions."""
        return self._consumer is not None and consumer is not self._consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        take_over(consumer, partitions, assign=True)  # whatever the session (see take_over)
        if self._stale(consumer):
            return
        parts = [tp.partition for tp in partitions]
        self.pauses.forget(parts)
        self._owned.update(parts)
        if partitions:
            try:  # a partition paused before a revoke must not come back paused
                consumer.resume(partitions)
            except KafkaException as exc:
                log.debug("delay %s: resume on assign: %s", self.interval, exc)
        log.info("delay %s: assigned %s", self.interval,
                 ", ".join(str(p) for p in parts) or "nothing")
        self.assigned.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        take_over(consumer, partitions, assign=False)
        if self._stale(consumer):
            return
        parts = [tp.partition for tp in partitions]
        self.pauses.forget(parts)
        self._owned.difference_update(parts)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        take_over(consumer, partitions, assign=False)
        if self._stale(consumer):
            return
        parts = [tp.partition for tp in partitions]
        log.warning("delay %s: lost partitions %s", self.interval, parts)
        self.pauses.forget(parts)
        self._owned.difference_update(parts)


# -- the service: one tailer per interval, following the bindings -------------------------


class DelayService:
    """Runs one :class:`DelayTailer` thread per interval any binding's ladder uses (and per
    delay topic that already exists), and creates the delay topics as bindings change."""

    def __init__(self, settings: Settings, client: SchedulerClient, stop: threading.Event,
                 options: DelayOptions | None = None) -> None:
        self.settings = settings
        self.client = client
        self.stop = stop
        self.options = options or DelayOptions()
        self.bindings = BindingBook(settings)
        self.tailers: dict[str, DelayTailer] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.follower = RegistryFollower(settings, self._on_bindings)

    def start(self) -> None:
        """Read the bindings, create their topics, start the tailers; follow changes."""
        self.follower.start()
        self._run_intervals(existing_delay_intervals(self.settings))

    def _on_bindings(self, bindings: dict[str, Binding]) -> None:
        self.bindings.update(bindings)
        try:
            ensure_binding_topics(self.settings, bindings.values())
        except AsynctierError as exc:
            log.error("could not create the delay and dead-letter topics: %s", exc)
        self._run_intervals(ladder_intervals(bindings.values()))

    def _run_intervals(self, intervals: set[float]) -> None:
        with self._lock:
            for interval_s in sorted(intervals):
                name = format_duration(interval_s)
                if name in self.tailers or self.stop.is_set():
                    continue
                tailer = DelayTailer(self.settings, interval_s, self.bindings, self.client,
                                     self.options)
                self.tailers[name] = tailer
                thread = threading.Thread(target=tailer.run, args=(self.stop,),
                                          name=f"delay-{name}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def wait_assigned(self, timeout_s: float) -> bool:
        """Wait until every tailer started so far had its first assignment."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            tailers = list(self.tailers.values())
        return all(t.assigned.wait(max(0.0, deadline - time.monotonic())) for t in tailers)

    def join(self, timeout_s: float = 120.0) -> None:
        """Stop following the bindings and wait for the tailers to finish."""
        self.follower.stop()
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))


def default_client(settings: Settings, wait_for_scheduler: bool = True) -> SchedulerClient:
    """A SchedulerClient on the live schedulers (Redis membership), falling back to the
    configured list: the delay path keeps working when Redis is down. Without
    ``wait_for_scheduler`` a call raises SchedulerUnavailable when none is known at all."""
    return SchedulerClient(SchedulerDirectory(settings).addresses,
                           wait_for_scheduler=wait_for_scheduler)


def run_delay_tailers(settings: Settings, stop: threading.Event,
                      client: SchedulerClient | None = None,
                      ready: Callable[[], object] | None = None,
                      options: DelayOptions | None = None) -> None:
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
    """
    own = client is None
    client = client or default_client(settings)
    service = DelayService(settings, client, stop, options)
    try:
        service.start()
        service.wait_assigned(service.options.ready_timeout_s)
        log.info("delay tailers running for %s", ", ".join(service.tailers) or "no interval yet")
        if ready is not None:
            ready()
        wait_for_stop(stop)  # not an untimed wait: see MAIN_WAKE_S
    finally:
        stop.set()
        service.join()
        if own:
            client.close()
