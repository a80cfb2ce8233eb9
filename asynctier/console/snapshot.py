"""What the pages show, read in the background: one snapshot every few seconds.

The :class:`Sampler` (a supervised loop) reads what ``asynctier lag`` reads (bindings,
lag per partition, delay topics, dead letters, the queue's backlog, the tailers' states),
the loops every process publishes and the live schedulers, and keeps the latest snapshot
and the :class:`~asynctier.console.history.History`. Pages render the snapshot, so a page
answers in the time of a template whatever the broker does; a service that does not answer
is named in ``down`` and the last good numbers stay, marked with their age.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from asynctier.cli.lag import Readers, Reading, ladder_of, read_all
from asynctier.console.history import History, Sample
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.lag import LagReader, LagRow
from asynctier.platform.membership import Member, live_members
from asynctier.platform.status import read_statuses
from asynctier.platform.supervise import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hop:
    """One step of a ladder: the delay topic's records not yet released (shared by every
    binding whose ladder has the step)."""

    interval: str
    waiting: int
    oldest_s: float | None


@dataclass(frozen=True)
class BindingView:
    """One binding as the overview shows it."""

    binding: Binding
    state: str
    lag: int
    lag_s: float | None
    throughput: float | None
    hops: list[Hop]
    dead: int  # dead letters (or dead items) kept
    dead_waiting: int  # of those, not replayed yet
    partitions: list[LagRow]

    @property
    def name(self) -> str:
        """The binding's name."""
        return self.binding.name

    @property
    def source(self) -> str:
        """``topic NAME`` or ``queue NAMESPACE/TOPIC``."""
        source = self.binding.source
        return (f"topic {source.topic}" if source.kind == "kafka"
                else f"queue {self.binding.tenant}/{source.topic}")


@dataclass(frozen=True)
class Snapshot:
    """Everything the overview shows, read at ``taken_s`` (epoch seconds)."""

    taken_s: float = 0.0
    bindings: list[BindingView] = field(default_factory=list)
    loops: dict[str, str] = field(default_factory=dict)
    schedulers: list[Member] = field(default_factory=list)
    #: Service -> what went wrong reading it (empty: all answered).
    down: dict[str, str] = field(default_factory=dict)
    #: When the bindings' numbers were last read (older than ``taken_s`` while Kafka is down).
    bindings_s: float = 0.0

    def view(self, name: str) -> BindingView | None:
        """The binding named ``name``, if there is one."""
        return next((v for v in self.bindings if v.name == name), None)


def views(reading: Reading, history: History, now_s: float) -> list[BindingView]:
    """One view per binding of ``reading``, its sample added to ``history``."""
    out = []
    delays = {r.name: r for r in reading.lag if r.kind == "delay"}
    states = {t.name: t.status for t in reading.tailers}
    backlog = {b.name: b for b in reading.backlog}
    for name, b in sorted(reading.bindings.items()):
        parts = [r for r in reading.lag if r.kind == "binding" and r.name == name]
        dlq = [r for r in reading.lag if r.kind == "dlq" and r.name == name]
        hops = [Hop(i, delays[i].lag, delays[i].lag_seconds) for i in ladder_of(b)
                if i in delays]
        if b.source.kind == "kafka":
            lag = sum(r.lag for r in parts)
            ages = [r.lag_seconds for r in parts if r.lag_seconds is not None]
            lag_s = max(ages, default=None if lag else 0.0)
            done: int | None = sum(r.committed or 0 for r in parts)
            dead, waiting = sum(r.end - r.low for r in dlq), sum(r.lag for r in dlq)
        else:
            row = backlog.get(name)
            lag = (row.ready or 0) + (row.delayed or 0) if row else 0
            lag_s = row.oldest_ready_age_s if row else None
            done = None
            dead = waiting = (row.dead or 0) if row else 0
        history.add(name, Sample(now_s, lag, lag_s, done))
        out.append(BindingView(b, states.get(name, "unknown"), lag, lag_s,
                               history.throughput(name), hops, dead, waiting, parts))
    history.forget_others(set(reading.bindings))
    return out


class Sampler:
    """Reads a :class:`Snapshot` every ``every_s`` seconds in a supervised thread."""

    def __init__(self, settings: Settings, history: History, every_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.history = history
        self.every_s = every_s
        self.clock = clock
        self.latest = Snapshot()
        self.turns = 0
        self._stop = threading.Event()
        self._supervisor: Supervisor | None = None

    def sample(self, readers: Readers) -> Snapshot:
        """Read once; keep and return the snapshot."""
        now = self.clock()
        down: dict[str, str] = {}
        previous = self.latest
        try:
            reading = read_all(self.settings, None, readers)
            bindings, bindings_s = views(reading, self.history, now), now
            errors = [r.error for r in reading.backlog if r.error]
            if errors:
                down["postgres"] = errors[0]
        except Exception as exc:  # the broker, or the registry on it: say so, keep the last
            down["kafka"] = f"{exc}"
            bindings, bindings_s = previous.bindings, previous.bindings_s
        loops = read_statuses(self.settings, self.clock)
        if loops is None:
            down["redis"] = f"Redis at {self.settings.redis_display} did not answer"
        try:
            members = live_members(self.settings)
        except Exception as exc:
            members = []
            down.setdefault("redis", str(exc))
        if loops is None:  # no new states: the bindings' states are unknown, not stale
            bindings = [replace(v, state="unknown") for v in bindings]
        self.latest = Snapshot(now, bindings, loops or {}, members, down, bindings_s)
        self.turns += 1
        return self.latest

    def _run(self, stop: threading.Event) -> None:
        readers = Readers(self.settings, LagReader(self.settings))
        try:
            while not stop.is_set():
                self.sample(readers)
                stop.wait(self.every_s)
        finally:
            readers.close()

    def start(self) -> None:
        """Sample in the background until :meth:`stop`."""
        self._supervisor = Supervisor("console sampler", self._run, self._stop,
                                      what="the console's sampler",
                                      hint="check that Kafka, Redis and the queue answer")
        self._supervisor.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(10.0)
