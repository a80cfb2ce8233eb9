"""Measuring processes while a contender drains its work: CPU seconds and peak RSS.

A :class:`Meter` follows named groups of processes (a group is found again at every
sample, so children that appear later are counted). :func:`watch_drain` polls a progress
count and the meter together and returns a :class:`Drain`: how many items were done
between the first poll that saw progress and the poll that saw the last one, how long
that took, and the CPU seconds each group spent in that same window.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

Finder = Callable[[], Iterable[psutil.Process]]


class BenchError(Exception):
    """A scenario could not be measured (it did not finish in time, a process died)."""


def tree(pid: int) -> Finder:
    """A finder for process ``pid`` and all its descendants."""
    def find() -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
    return find


def single(pid: int | None) -> Finder:
    """A finder for one process (none when ``pid`` is None)."""
    def find() -> list[psutil.Process]:
        if pid is None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            return [psutil.Process(pid)]
        return []
    return find


def python_speed(loops: int = 2_000_000, tries: int = 3) -> float:
    """Millions of iterations a second of one fixed pure-Python loop, the best of ``tries``.

    The same checkout has drained at rates 2x apart on different days of this shared
    machine; a results file that gives this figure at its start and end tells a slower
    machine from a slower change. Only figures of one machine compare."""
    best = float("inf")
    for _ in range(max(1, tries)):
        begun = time.perf_counter()
        total = 0
        for i in range(loops):
            total += i * i
        best = min(best, time.perf_counter() - begun)
    return loops / best / 1e6


def _vm_hwm(pid: int) -> int:
    """The kernel's peak RSS of ``pid`` (VmHWM) in bytes; 0 when unreadable."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class _Group:
    find: Finder
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    peak_rss: int = 0  # of the group's processes together
    peak_each: int = 0  # of its largest process (VmHWM: between samples too)

    def sample(self) -> None:
        total_rss = 0
        procs = list(self.find())
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                times = proc.cpu_times()
                self.cpu_by_pid[proc.pid] = times.user + times.system
                rss = proc.memory_info().rss
                total_rss += rss
                self.peak_each = max(self.peak_each, rss, _vm_hwm(proc.pid))
        if len(procs) == 1:
            total_rss = max(total_rss, _vm_hwm(procs[0].pid))
        self.peak_rss = max(self.peak_rss, total_rss)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_pid.values())


class Meter:
    """CPU seconds and peak RSS of named groups of processes."""

    def __init__(self, groups: Mapping[str, Finder]) -> None:
        self._groups = {name: _Group(find) for name, find in groups.items()}

    def sample(self) -> None:
        """Read every group's processes now."""
        for group in self._groups.values():
            group.sample()

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) each group has used so far (as last sampled)."""
        return {name: g.cpu_s for name, g in self._groups.items()}

    def peak_rss(self) -> dict[str, int]:
        """The highest RSS (bytes) each group had at a sample (VmHWM for single processes)."""
        return {name: g.peak_rss for name, g in self._groups.items()}

    def peak_rss_each(self) -> dict[str, int]:
        """The highest RSS (bytes) of any one process of each group (what a container of
        one process needs)."""
        return {name: g.peak_each for name, g in self._groups.items()}


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy so far (not idle, not waiting
    for I/O), whoever used them."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0)
               for name in ("user", "nice", "system", "irq", "softirq", "steal"))


@dataclass(frozen=True)
class Drain:
    """One measured drain: ``items`` done in ``seconds``; CPU seconds per group, and the
    share of the machine's cores busy in the window (anyone's work: the broker's too)."""

    items: int
    seconds: float
    cpu_s: Mapping[str, float]
    peak_rss: Mapping[str, int]
    peak_rss_each: Mapping[str, int] = field(default_factory=dict)
    cores_busy: float | None = None

    @property
    def rate(self) -> float:
        """Items per second."""
        return self.items / self.seconds if self.seconds > 0 else 0.0


def watch_drain(progress: Callable[[], int], total: int, meter: Meter, timeout_s: float,
                poll_s: float = 0.05, check: Callable[[], None] | None = None) -> Drain:
    """Poll ``progress()`` (items done so far) until it reaches ``total``.

    The window opens at the first poll that sees progress and closes at the poll that sees
    ``total``; CPU is the difference of the meter's readings at those two polls. ``check``
    runs at every poll and may raise (a contender's process died). Raises BenchError when
    ``total`` is not reached within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    start: tuple[float, int, dict[str, float], float] | None = None
    done = 0
    while True:
        now = time.monotonic()
        done = progress()
        meter.sample()
        if start is None and done > 0:
            start = (now, done, meter.cpu(), machine_busy_s())
        if done >= total and start is not None:
            cpu_end = meter.cpu()
            cpu = {k: cpu_end[k] - start[2].get(k, 0.0) for k in cpu_end}
            seconds = now - start[0]
            busy = ((machine_busy_s() - start[3]) / (seconds * (psutil.cpu_count() or 1))
                    if seconds > 0 else None)
            return Drain(done - start[1], seconds, cpu, meter.peak_rss(),
                         meter.peak_rss_each(), busy)
        if now > deadline:
            raise BenchError(f"only {done:,} of {total:,} done after {timeout_s:g} s")
        if check is not None:
            check()
        time.sleep(poll_s)


def write_section(path: Path, section: str) -> None:
    """Put ``section`` into ``path`` in place of the one with its heading (or at the end)."""
    heading = section.splitlines()[0] + "\n"  # whole line: one heading may begin another
    text = path.read_text() if path.exists() else ""
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        rest = "" if end < 0 else "\n" + text[end + 1:]  # a blank line before the next
        text = text[:start] + section.rstrip("\n") + "\n" + rest
    path.write_text(text)
