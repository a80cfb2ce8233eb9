"""bench.cpu_waits: the kernel's per-thread scheduler statistics, summed per process label
over a window (real /proc of real processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench import cpu_waits

BUSY = "import time\nend = time.monotonic() + 0.6\nwhile time.monotonic() < end: pass\n"


def test_a_busy_process_shows_its_cpu_and_a_label_per_asynctier_component() -> None:
    before = cpu_waits.snapshot()
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        # read while it runs (its counters go with it when it exits)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            after = cpu_waits.snapshot()
            if proc.pid in after and after[proc.pid][1] > 300_000_000:
                break
        rows = {w.label: w for w in cpu_waits.between(before, after)}
    finally:
        proc.wait(10)
    mine = after[proc.pid]
    assert mine[1] > 300_000_000 and mine[3] > 0  # ns on a core, slices
    python = rows[mine[0]]
    assert python.cpu_ms >= 300 and python.slices > 0
    assert python.wait_per_slice_us == 1000 * python.wait_ms / python.slices
    text = "\n".join(cpu_waits.lines(list(rows.values()), 1.0))
    assert "cores busy" in text and mine[0] in text


def test_labels_name_the_component_and_tier_of_asynctier_run() -> None:
    # alive until killed: it blocks on its standard input
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()",
                             "asynctier", "run", "tailers", "--tier", "batch"],
                            stdin=subprocess.PIPE)
    try:
        assert cpu_waits.label(psutil.Process(proc.pid)) == "tailers batch"
    finally:
        proc.kill()
        proc.wait()


def test_counters_are_taken_per_process_so_a_renamed_one_is_not_counted_whole() -> None:
    before = {7: ("kworker/a", 10, 20, 3)}
    after = {7: ("kworker/b", 15, 26, 5), 8: ("new", 4, 2, 1)}
    rows = {w.label: w for w in cpu_waits.between(before, after)}
    assert (rows["kworker/b"].cpu_ms, rows["kworker/b"].wait_ms, rows["kworker/b"].slices) \
        == (5e-6, 6e-6, 2)
    assert rows["new"].slices == 1  # started in the window: all of it counts


def test_a_child_of_a_component_is_named_after_it() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', "
         "'import sys; sys.stdin.read()'], stdin=subprocess.PIPE); "
         "print(c.pid, flush=True); c.wait()",
         "asynctier", "run", "scheduler", "--tier", "urgent"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert cpu_waits.label(child) == "worker of scheduler urgent"
    finally:
        for proc in psutil.Process(parent.pid).children():
            proc.kill()
        parent.kill()
        parent.wait()
