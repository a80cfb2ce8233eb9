"""Rate limits and concurrency caps hold across two scheduler processes (real Kafka, Redis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asynctier.platform.config import Settings
from tests.funcs import ledger
from tests.helpers import wait_until
from tests.platform_harness import Platform, produce_json


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.ledger",))
    yield plat
    plat.stop_all()


def test_rate_limit_holds_across_two_schedulers(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    topic = unique_topic(4)
    n = 3000
    produce_json(settings, topic, [{"id": i} for i in range(n)], key_of="id")
    platform.cli("bind", "limited", "--topic", topic, "--function", "tests.funcs.ledger:record",
                 "--rate", "200", "--burst", "20")
    platform.start("scheduler", "scheduler-a")
    platform.start("scheduler", "scheduler-b")
    platform.start("tailers")
    wait_until(lambda: len(ledger.ids_seen(platform.ledger)) >= n, 60, "every id ran")
    calls = sorted(c.at for c in ledger.read(platform.ledger))
    window = calls[-1] - calls[100]  # past the first burst and the start-up
    rate = (len(calls) - 101) / window
    print(f"\nrate over {len(calls)} calls with two schedulers: {rate:.1f}/s (limit 200/s)")
    assert 180 <= rate <= 220, rate


def test_concurrency_cap_holds_across_two_schedulers(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    topic = unique_topic(4)
    n = 200
    produce_json(settings, topic, [{"id": i, "sleep": 0.05} for i in range(n)], key_of="id")
    platform.cli("bind", "capped", "--topic", topic, "--function", "tests.funcs.ledger:span",
                 "--concurrency", "4")
    platform.start("scheduler", "scheduler-a")
    platform.start("scheduler", "scheduler-b")
    platform.start("tailers", None, "--batch-size", "50")
    wait_until(lambda: len(ledger.spans(platform.ledger)) >= n, 60, "every id ran")
    spans = ledger.spans(platform.ledger)
    events = sorted([(s, 1) for _, s, _, _ in spans] + [(e, -1) for _, _, e, _ in spans],
                    key=lambda ev: (ev[0], ev[1]))  # an end before a start at the same time
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    schedulers = {pid for *_, pid in spans}
    print(f"\npeak concurrency {peak} (cap 4), {len(schedulers)} scheduler process(es) ran")
    assert peak <= 4
    assert peak >= 3  # the cap is used, not just respected
    assert len(schedulers) == 2


def test_over_quota_items_are_delayed_then_all_run_none_dead(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    """Quota end to end: what is over the quota waits for the next minute's window (up to
    a minute of the default run), spending no attempt, and nothing is a dead letter."""
    topic = unique_topic(2)
    n, quota = 120, 50
    platform.cli("quota", "set", "acme", "--per-minute", str(quota))
    platform.cli("bind", "metered", "--topic", topic, "--function", "tests.funcs.ledger:record",
                 "--tenant", "acme", "--retry-ladder", "1s,2s,4s,8s", "--max-attempts", "2")
    platform.start("scheduler")
    platform.start("tailers")
    platform.start("delay")
    produce_json(settings, topic, [{"id": i} for i in range(n)], key_of="id")
    wait_until(lambda: len(ledger.ids_seen(platform.ledger)) >= n, 200, "every id ran")
    calls = ledger.read(platform.ledger)
    assert all(c.attempt == 1 for c in calls)  # a quota delay spends no attempt
    first_minute = {int(c.at // 60) for c in calls}
    assert len(first_minute) >= 2  # what was over quota ran in a later minute
    per_minute = {m: sum(1 for c in calls if int(c.at // 60) == m) for m in first_minute}
    assert max(per_minute.values()) <= quota, per_minute
    dlq = platform.cli("dlq", "list", "metered", "--json").stdout
    assert dlq.strip() in ("[]", ""), dlq
