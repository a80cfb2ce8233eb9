"""The bench's machine-speed figure: the best of its tries, in millions of loops a second
(pure logic: a fake clock, no services); a section written into RESULTS.md; the peak RSS
of a group of processes; how busy the cores were in a drain's window."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench import measure
from bench.measure import Meter, watch_drain


def test_python_speed_is_the_fastest_try(monkeypatch: pytest.MonkeyPatch) -> None:
    # three tries of 1,000,000 loops taking 0.5 s, 0.25 s and 1.0 s: the machine at its
    # least disturbed ran 4 M loops a second
    ticks: Iterator[float] = iter([0.0, 0.5, 10.0, 10.25, 20.0, 21.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    assert measure.python_speed(loops=1_000_000, tries=3) == pytest.approx(4.0)


def test_python_speed_makes_at_least_one_try(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: Iterator[float] = iter([0.0, 2.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    assert measure.python_speed(loops=1_000_000, tries=0) == pytest.approx(0.5)


def test_a_section_written_in_place_keeps_a_blank_line_before_the_next(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## A\n\nold\n\n## B\n\nb\n")
    measure.write_section(results, "## A\n\nnew\n```\nx=1\n```")
    assert results.read_text() == "# Results\n\n## A\n\nnew\n```\nx=1\n```\n\n## B\n\nb\n"
    measure.write_section(results, "## B\n\nnew b\n")
    assert results.read_text().endswith("```\n\n## B\n\nnew b\n")
    measure.write_section(results, "## C\n\nc")
    assert results.read_text().endswith("## B\n\nnew b\n\n## C\n\nc")


def test_a_group_keeps_its_largest_process_peak_apart_from_their_sum() -> None:
    """Three real child processes, one holding 60 MB more than the others: the group's
    peak is their sum, its largest process's peak the one that holds it (a container of
    one process needs that, not the sum)."""
    hold = ("import sys; b = bytearray(int(sys.argv[1]) * 2**20); "
            "b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", hold, str(mb)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for mb in (0, 0, 60)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
        meter = measure.Meter({"g": lambda: [psutil.Process(p.pid) for p in procs]})
        meter.sample()
        rss = [psutil.Process(p.pid).memory_info().rss for p in procs]
        each, total = meter.peak_rss_each()["g"], meter.peak_rss()["g"]
        assert each >= max(rss) >= each - 2**20 * 4  # VmHWM: the process's own peak
        assert each - min(rss) > 50 * 2**20
        assert total == pytest.approx(sum(rss), rel=0.01)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_drain_says_how_busy_the_cores_were_in_its_window() -> None:
    done = 0

    def progress() -> int:  # one core kept busy between polls
        nonlocal done
        until = time.thread_time() + 0.05
        while time.thread_time() < until:
            pass
        done += 1
        return done

    drain = watch_drain(progress, 6, Meter({}), timeout_s=30, poll_s=0.001)
    cores = psutil.cpu_count() or 1
    assert drain.cores_busy is not None
    # this thread alone kept one core busy for most of the window
    assert 0.5 / cores < drain.cores_busy <= 1.0
