"""Weighted tenants on real processes: weights set live, shared by two schedulers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asynctier.platform.config import Settings
from tests.funcs.deadline import starts
from tests.helpers import wait_until
from tests.platform_harness import Platform, produce_json


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.deadline",))
    yield plat
    plat.stop_all()


@pytest.mark.timeout(900)
def test_weights_3_to_1_hold_across_two_schedulers(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings,
        request: pytest.FixtureRequest) -> None:
    """16,000 records of 15 ms (about 15 s), so that the shares are taken over many DRR
    rounds: a scheduler spreads a chunk of I/O-bound items over threads, and with quicker
    items the run is over in a few seconds, too short to measure a share.

    In the default run another test shares the two cores, and the one tailer process that
    feeds both bindings may not keep the heavy tenant's backlog full all the time: the
    bound is looser there (still far from 1:1, or from one tenant taking all); ``--long``
    runs on a quiet machine and holds the share within 10%."""
    path = platform.config_file()
    path.write_text(path.read_text() + "\n[scheduler]\nworkers = 2\n")
    heavy, light = unique_topic(4), unique_topic(4)
    n_heavy, n_light = 12_000, 4_000  # 3:1, so both stay backlogged to the end
    fn = "tests.funcs.deadline:note"
    platform.cli("bind", "heavy", "--topic", heavy, "--function", fn, "--tenant", "acme")
    platform.cli("bind", "light", "--topic", light, "--function", fn, "--tenant", "zeta")
    platform.start("scheduler", "scheduler-a")
    platform.start("scheduler", "scheduler-b")
    platform.cli("tenant", "set", "acme", "--weight", "3")  # followed live
    for name in ("scheduler-a", "scheduler-b"):
        wait_until(lambda name=name: "'acme': 3.0" in platform.log(name, 100_000),  # type: ignore[misc]
                   10, f"{name} follows the weight")
    produce_json(settings, heavy, [{"id": i, "sleep": 0.015} for i in range(n_heavy)])
    produce_json(settings, light, [{"id": i, "sleep": 0.015} for i in range(n_light)])
    platform.start("tailers")
    wait_until(lambda: len(starts(platform.ledger)) >= n_heavy + n_light, 300,
               "every record ran", interval=1.0)
    got = sorted(starts(platform.ledger), key=lambda s: s.start)
    first_done = min(max(s.start for s in got if s.binding == b) for b in ("heavy", "light"))
    begin = got[0].start + 2.0  # past the start-up
    window = [s for s in got if begin <= s.start < first_done - 1.0]
    a = sum(s.binding == "heavy" for s in window)
    b = sum(s.binding == "light" for s in window)
    ratio = a / max(b, 1)
    span = first_done - 1.0 - begin
    print(f"\nacme:zeta = {a}:{b} = {ratio:.2f} over {span:.1f}s (weights 3:1, two schedulers)")
    assert span >= 5.0, f"both tenants were backlogged for {span:.1f}s only: too short to measure"
    low, high = (2.7, 3.3) if request.config.getoption("--long") else (2.2, 3.8)
    assert low <= ratio <= high, (a, b)
    rows = {r["tenant"]: r for r in json.loads(platform.cli("tenant", "show", "--json").stdout)}
    assert rows["acme"]["weight"] == 3.0 and rows["zeta"]["weight"] == 1.0
    # usage over all schedulers, this minute and the last (the run may be longer)
    started = {t: rows[t]["started_this_minute"] + rows[t]["started_last_minute"]
               for t in ("acme", "zeta")}
    assert 0 < started["acme"] <= n_heavy and 0 < started["zeta"] <= n_light, started
    assert started["acme"] > 2 * started["zeta"], started
