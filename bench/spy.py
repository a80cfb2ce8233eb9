"""Where the time goes: py-spy attached to the tailer and scheduler processes while
asynctier drains the main topic (with the no-op, or with the always-failing function).

py-spy is attached once the first offsets are committed (so start-up is not in it) and
samples, 250 times a second, the stack of whichever thread holds the GIL (``--gil``):
each process's Python CPU time. :func:`summarize` turns the collapsed stacks into each
function's share of the samples, both *inclusive* (the function is anywhere on the
stack) and *self* (it is the leaf). Time in C without the GIL (librdkafka's and gRPC's
own threads) is not in it; the CPU seconds per process are in the throughput table.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.asynctier_run import AsynctierRun
from bench.measure import BenchError
from bench.records import GroupProgress
from bench.scenarios import drain_asynctier, platform
from bench.stack import Services

TARGETS = ("tailers", "scheduler")


@dataclass(frozen=True)
class Share:
    """One function's share of a process's samples."""

    function: str
    inclusive: float
    self_: float


@dataclass(frozen=True)
class Profile:
    """The top functions of each profiled process, and the samples behind them."""

    processes: dict[str, list[Share]]
    samples: dict[str, int]
    files: dict[str, Path]


def py_spy() -> str | None:
    """The py-spy executable (next to this Python first), or None."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/module.py:123)".
    name, _, where = frame.partition(" (")
    path = where.split(":", 1)[0]
    for marker in ("site-packages/", "/asynctier/", "/bench/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


def summarize(collapsed: str, top: int = 15) -> tuple[list[Share], int]:
    """Top functions by inclusive share, from py-spy's raw (collapsed) output."""
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";") if f]
        total += count
        for name in set(frames[1:]):  # the first frame is the thread / process label
            inclusive[name] += count
        if frames:
            leaf[frames[-1]] += count
    if not total:
        return [], 0
    names = [n for n, _ in inclusive.most_common(top)]
    self_top = [n for n, _ in leaf.most_common(top) if n not in names]
    return [Share(n, inclusive[n] / total, leaf[n] / total) for n in names + self_top], total


def _wait_pids(run: AsynctierRun, timeout_s: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = run.pids()
        if all(t in pids for t in TARGETS):
            return pids
        run.check()()
        time.sleep(0.1)
    raise BenchError("the tailer and scheduler processes did not appear")


def profile_drain(services: Services, folder: Path, topic: str, n: int,
                  function: str = "noop", bind_args: tuple[str, ...] = ()) -> Profile:
    """Drain ``topic`` with ``bench.noop:<function>`` (bound with ``bind_args`` more, for
    example a rate) under py-spy; the summary per process."""
    exe = py_spy()
    if exe is None:
        raise BenchError("py-spy is not installed (pip install py-spy)")
    spies: dict[str, subprocess.Popen[bytes]] = {}
    files = {t: folder / f"profile-{function}-{t}.txt" for t in TARGETS}
    with platform(services, folder, f"profile-{function}") as run:
        run.bind(function, topic, function, *bind_args)
        progress = GroupProgress(services.kafka_bootstrap, run.group(function), topic)

        def attach() -> None:
            if spies or progress.committed() == 0:
                return
            for target, pid in _wait_pids(run).items():
                if target in TARGETS:
                    spies[target] = subprocess.Popen(
                        [exe, "record", "--pid", str(pid), "--rate", "250", "--format",
                         "raw", "--gil", "--output", str(files[target]), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        try:
            drain_asynctier(services, run, topic, n, function, attach)
        finally:
            _stop_spies(spies)
            progress.close()
    shares: dict[str, list[Share]] = {}
    samples: dict[str, int] = {}
    for target, path in files.items():
        text = path.read_text() if path.exists() else ""
        shares[target], samples[target] = summarize(text)
    return Profile(shares, samples, files)


def _stop_spies(spies: dict[str, subprocess.Popen[bytes]]) -> None:
    for spy in spies.values():
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)
    for spy in spies.values():
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()

