"""``--defer-when-busy`` on real processes: Kafka, Redis, ``asynctier run`` subprocesses.

An urgent binding's backlog saturates a scheduler of 2 workers; a ``--defer-when-busy``
binding (``--start-within 2h``) backlogged beside it starts little until the urgent backlog
ends, then drains; its records whose deadline is near run during the peak all the same;
none misses its deadline, and with ``--max-attempts 1`` none is a dead letter (parking
spends no attempt). The short variant runs by default; the long one (``--long``) is larger
and also runs the same load without ``--defer-when-busy``, for comparison.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from asynctier.platform.config import Settings
from tests.funcs.deadline import Start, starts
from tests.helpers import wait_until
from tests.platform_harness import Platform, cli_in_process, free_port, produce_json

FN = "tests.funcs.deadline:note"
WINDOW_S = 7200.0  # the deferred binding's --start-within 2h
#: Late records' Kafka timestamps: 1h45m old, so 15 min to their deadline (under a quarter
#: of the window: released, never parked).
LATE_AGE_S = WINDOW_S - 900.0


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.deadline",))
    yield plat
    plat.stop_all()


@dataclass(frozen=True)
class Figures:
    """What one run measured."""

    startup_s: float  # from the records made to the first start (processes starting)
    hot_s: float  # the urgent backlog: its first start to its last
    cold_during: int  # fresh deferred records started during the urgent backlog
    cold_before: int  # ... before it got going (its first second)
    late_during: int  # near-deadline records started during the urgent backlog
    drain_s: float  # the urgent backlog's end to the deferred binding's last start
    latest_start_s: float  # the latest deferred start after its record was made
    deferred_total: float  # asynctier_deferred_total{binding="cold"} of the scheduler


def _produce_late(settings: Settings, topic: str, ids: range) -> None:
    """Records whose Kafka timestamp is LATE_AGE_S old (their deadline is near)."""
    producer = Producer(settings.kafka_config())
    stamp = int((time.time() - LATE_AGE_S) * 1000)
    for i in ids:
        producer.produce(topic, json.dumps({"id": i, "sleep": 0.005}).encode(),
                         timestamp=stamp)
    assert producer.flush(30) == 0


def _scrape(port: int, name: str, binding: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    for line in text.decode().splitlines():
        if line.startswith(f'{name}{{binding="{binding}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _run(platform: Platform, settings: Settings, unique_topic: Callable[..., str],
         n_hot: int, n_cold: int, n_late: int, defer: bool = True) -> Figures:
    hot, cold = unique_topic(2), unique_topic(2)
    path = platform.config_file()
    path.write_text(path.read_text() + "\n[scheduler]\nworkers = 2\n")
    cli_in_process(platform, "bind", "hot", "--topic", hot, "--function", FN,
                   "--priority", "urgent")
    cli_in_process(platform, "bind", "cold", "--topic", cold, "--function", FN,
                   "--start-within", "2h", "--retry-ladder", "1s,2s", "--max-attempts", "1",
                   *(["--defer-when-busy"] if defer else []))
    made = time.time()
    produce_json(settings, cold, [{"id": i, "sleep": 0.005} for i in range(n_cold)])
    _produce_late(settings, cold, range(n_cold, n_cold + n_late))
    # 80 ms each: with 2 workers the scheduler runs a measured sync binding's chunks over
    # 2 x SYNC_SPREAD = 16 threads, and the urgent backlog must still outlast them for a
    # few seconds (800 x 80 ms / 16 = 4 s)
    produce_json(settings, hot, [{"id": i, "sleep": 0.08} for i in range(n_hot)])
    port = free_port()
    platform.start("scheduler", None, "--metrics-port", str(port))
    platform.start("tailers")
    platform.start("delay")

    def ran(binding: str) -> list[Start]:
        return [s for s in starts(platform.ledger) if s.binding == binding]

    wait_until(lambda: len(ran("hot")) >= n_hot, 120, "the urgent backlog ran")
    wait_until(lambda: len(ran("cold")) >= n_cold + n_late, 120, "the deferred backlog ran")
    hot_starts = sorted(s.start for s in ran("hot"))
    first, last = hot_starts[0], hot_starts[-1]
    cold_runs = ran("cold")
    fresh = [s for s in cold_runs if s.id < n_cold]
    late = [s for s in cold_runs if s.id >= n_cold]
    assert len({s.id for s in cold_runs}) == n_cold + n_late
    assert all(s.start <= s.deadline for s in cold_runs)  # ctx.deadline was kept
    assert all(s.start - made < WINDOW_S for s in fresh)  # none missed its deadline
    dead = json.loads(cli_in_process(platform, "dlq", "list", "cold", "--json") or "[]")
    assert dead == []  # parked records spent no attempt (max attempts 1)
    return Figures(
        startup_s=min(first, *(s.start for s in cold_runs)) - made,
        hot_s=last - first,
        cold_during=sum(first + 1.0 <= s.start <= last for s in fresh),
        cold_before=sum(s.start < first + 1.0 for s in fresh),
        late_during=sum(s.start <= last for s in late),
        drain_s=max(s.start for s in cold_runs) - last,
        latest_start_s=max(s.start for s in fresh) - made,
        deferred_total=_scrape(port, "asynctier_deferred_total", "cold"),
    )


def _check(f: Figures, n_cold: int, n_late: int) -> None:
    print(f"\n{f}")
    assert f.hot_s >= 2.0, "the urgent backlog was too short to saturate anything"
    # without deferral the normal tier gets 4 of every 12 items: a third of the capacity
    assert f.cold_during <= 0.05 * n_cold, f
    assert f.late_during == n_late, f  # near their deadline: not deferred
    assert f.deferred_total > 0, f


def test_deferred_work_waits_out_an_urgent_backlog_then_drains(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    figures = _run(platform, settings, unique_topic, n_hot=800, n_cold=300, n_late=10)
    _check(figures, 300, 10)


@pytest.mark.slow
def test_deferred_work_waits_out_a_long_urgent_backlog_against_no_deferral(
        settings: Settings, unique_topic: Callable[..., str], tmp_path: Path) -> None:
    n_hot, n_cold, n_late = 4000, 2000, 50
    runs = {}
    for defer in (True, False):
        folder = tmp_path / ("defer" if defer else "plain")
        folder.mkdir()
        own = dataclasses.replace(settings, prefix=f"{settings.prefix}-{folder.name}")
        plat = Platform(own, folder, allow=("tests.funcs.deadline",))
        try:
            runs[defer] = _run(plat, plat.settings, unique_topic, n_hot, n_cold, n_late,
                               defer=defer)
        finally:
            plat.stop_all()
    print(f"\nwith --defer-when-busy: {runs[True]}\nwithout: {runs[False]}")
    _check(runs[True], n_cold, n_late)
    assert runs[False].cold_during > 5 * max(runs[True].cold_during, 1)
