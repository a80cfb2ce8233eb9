"""How long each process of a run waited for a core: the kernel's scheduler statistics.

``/proc/PID/task/TID/schedstat`` holds, per thread, the nanoseconds it ran, the
nanoseconds it sat runnable in a run queue, and the time slices it ran. Taken before and
after a window and summed over a process's threads, they say whether a process that
should start at once (an urgent tailer, its scheduler) was kept from a core by others,
and how full the cores were. Used by ``python -m bench.urgency --cpu-waits``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

#: Per process: its label and three counters summed over its threads: ns on a core, ns
#: waiting for one, slices.
Counters = dict[int, tuple[str, int, int, int]]


@dataclass(frozen=True)
class Waits:
    """One label's use of the cores over a window."""

    label: str
    processes: int
    cpu_ms: float
    wait_ms: float
    slices: int

    @property
    def wait_per_slice_us(self) -> float:
        """The mean wait for a core before each slice it ran."""
        return 1000 * self.wait_ms / self.slices if self.slices else 0.0


def label(proc: psutil.Process) -> str:
    """A process's name for the table: the component of ``asynctier run`` it runs (with
    its tier), a child process of one (a scheduler's worker process), the Kafka broker,
    or its own name."""
    try:
        argv = proc.cmdline()
        if "run" in argv and "asynctier" in argv:
            words = argv[argv.index("run") + 1:]
            component = words[0] if words and not words[0].startswith("-") else "run"
            tier = words[words.index("--tier") + 1] if "--tier" in words[:-1] else ""
            return f"{component} {tier}".strip()
        if any(part.endswith("kafka.Kafka") for part in argv):
            return "kafka broker"
        parent = proc.parent()
        owner = label(parent) if parent is not None else ""
        if parent is not None and owner != parent.name():
            return f"worker of {owner}"  # a scheduler's worker process
        return proc.name()
    except psutil.Error:
        return "gone"


def snapshot() -> Counters:
    """Every process of the machine: its label and counters."""
    found: Counters = {}
    for proc in psutil.process_iter():
        found[proc.pid] = (label(proc), *_process(proc.pid))
    return found


def _process(pid: int) -> tuple[int, int, int]:
    """A process's counters summed over its live threads (zero when it is gone)."""
    total = [0, 0, 0]
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0, 0
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue
        for i in range(3):
            total[i] += int(fields[i])
    return total[0], total[1], total[2]


def between(before: Counters, after: Counters) -> list[Waits]:
    """Each label's use of the cores from ``before`` to ``after`` (a process by its pid,
    named by its label at the end), the most CPU first. A thread that ended in between
    takes its counters with it: the figures are lower bounds."""
    sums: dict[str, list[float]] = {}
    for pid, (name, ran, waited, slices) in after.items():
        old = before.get(pid, ("", 0, 0, 0))
        row = sums.setdefault(name, [0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += (ran - old[1]) / 1e6
        row[2] += (waited - old[2]) / 1e6
        row[3] += max(0, slices - old[3])
    rows = [Waits(name, int(n), cpu, wait, int(slices))
            for name, (n, cpu, wait, slices) in sums.items()]
    return sorted(rows, key=lambda w: -w.cpu_ms)


def lines(rows: list[Waits], window_s: float) -> list[str]:
    """The table as text lines: share of a core, and the wait for one per slice."""
    cores = os.cpu_count() or 1
    busy = sum(w.cpu_ms for w in rows) / (1000 * window_s * cores)
    out = [f"    cores busy (these processes): {busy:.0%} of {cores}"]
    for w in rows:
        if w.cpu_ms < 1 and w.wait_ms < 1:
            continue
        out.append(f"    {w.label:<22} x{w.processes:<2} cpu {w.cpu_ms / (10 * window_s):5.1f}% "
                   f"of a core, waited {w.wait_ms:8.1f} ms over {w.slices:6d} slices: "
                   f"{w.wait_per_slice_us:7.0f} us a slice")
    return out
