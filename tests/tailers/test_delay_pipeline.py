"""Issue 4 end to end: the real processes (``asynctier run scheduler | tailers | delay``)
on the real Kafka, with the short ladder 1s,2s,4s."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asynctier.platform import names as n
from asynctier.platform.config import Settings
from tests.funcs import ledger
from tests.funcs.delay import FIXED
from tests.helpers import wait_until
from tests.platform_harness import Platform, committed_vs_end, produce_json, read_topic

LADDER = "1s,2s,4s"


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.ledger", "tests.funcs.delay"))
    yield plat
    plat.stop_all()


def calls_by_id(path: Path) -> dict[int, list[ledger.Call]]:
    """Ledger calls per id, in time order."""
    out: dict[int, list[ledger.Call]] = {}
    for call in ledger.read(path):
        out.setdefault(call.id, []).append(call)
    for calls in out.values():
        calls.sort(key=lambda c: c.at)
    return out


def test_retries_do_not_hold_the_main_topic_and_dead_letters_replay_after_a_fix(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    total = 10_000
    twice = [i for i in range(total) if i % 10 == 0]          # 10%: fail twice, then succeed
    always = [i for i in range(total) if i % 100 == 1]        # 1%: always fail
    docs: list[dict[str, object]] = [{"id": i} for i in range(total)]
    for i in twice:
        docs[i]["fail_until"] = 3
    for i in always:
        docs[i]["always_fail"] = True
    topic = unique_topic(4)
    produce_json(settings, topic, docs, key_of="id")
    platform.cli("bind", "orders", "--topic", topic, "--function", "tests.funcs.ledger:record",
                 "--retry-ladder", LADDER, "--max-attempts", "3")
    platform.start("scheduler")
    platform.start("delay")
    platform.start("tailers", None, "--batch-size", "500")

    group = settings.names.group("orders")
    wait_until(lambda: committed_vs_end(settings, group, topic) == (total, total), 120,
               "the main group's lag reached 0")
    runs = calls_by_id(platform.ledger)
    pending = sum(len(runs.get(i, [])) < 3 for i in twice)
    print(f"\nmain lag 0 while {pending} of {len(twice)} retried records were still pending")
    assert pending > 0, "the main topic waited for the retries"

    def settled() -> bool:
        runs = calls_by_id(platform.ledger)
        return all(len(runs.get(i, [])) >= 3 for i in (*twice, *always))

    wait_until(settled, 120, "every retried record ran 3 times")
    runs = calls_by_id(platform.ledger)
    for i in range(total):
        attempts = [c.attempt for c in runs[i]]
        if i in twice or i in always:
            assert attempts == [1, 2, 3], (i, attempts)
            first, second, third = (c.at for c in runs[i])
            assert second - first >= 1.0 and third - second >= 2.0, (i, first, second, third)
        else:
            assert attempts == [1], (i, attempts)

    dlq = settings.names.dlq_topic("orders")
    wait_until(lambda: len(read_topic(settings, dlq)) >= len(always), 30, "the dead letters")
    letters = read_topic(settings, dlq)
    assert sorted(int(m.key()) for m in letters) == always  # type: ignore[attr-defined]
    where = {int(m.key()): f"{topic}/{m.partition()}/{m.offset()}".encode()  # type: ignore
             for m in read_topic(settings, topic)}
    for msg in letters:
        i = int(msg.key())  # type: ignore[attr-defined]
        assert msg.value() == json.dumps(docs[i]).encode()  # type: ignore[attr-defined]
        headers = dict(msg.headers())  # type: ignore[attr-defined]
        assert headers[n.H_ATTEMPTS_MADE] == b"3"
        assert headers[n.H_ORIGIN] == where[i]  # written by the main tailer's first hand-off
        assert f"record {i} always fails".encode() in headers[n.H_ERROR]

    # The fix: bind the fixed function, wait until the scheduler runs it, replay.
    platform.cli("bind", "orders", "--topic", topic, "--function", "tests.funcs.delay:fixed",
                 "--retry-ladder", LADDER, "--max-attempts", "3")
    probes = iter(range(-1, -1000, -1))

    def fixed_runs_a_probe() -> bool:
        if any(c.id < 0 and c.source.startswith(FIXED) for c in ledger.read(platform.ledger)):
            return True
        produce_json(settings, topic, [{"id": next(probes)}])
        return False

    wait_until(fixed_runs_a_probe, 60, "the scheduler runs the fixed function")
    replay = platform.cli("dlq", "replay", "orders", "--canary", "5")
    assert f"replayed {len(always)} of {len(always)}" in replay.stdout, replay.stdout
    fixed_runs = [c for c in ledger.read(platform.ledger)
                  if c.source.startswith(f"{FIXED}{dlq}/")]
    assert sorted(c.id for c in fixed_runs) == always
    again = platform.cli("dlq", "replay", "orders")
    assert "replayed 0 of 0" in again.stdout, again.stdout
    assert len([c for c in ledger.read(platform.ledger)
                if c.source.startswith(f"{FIXED}{dlq}/")]) == len(always)


def test_a_delay_tailer_killed_mid_stream_loses_nothing_and_releases_nothing_early(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    total = 20_000
    topic = unique_topic(4)
    produce_json(settings, topic, [{"id": i, "fail_until": 2} for i in range(total)],
                 key_of="id")
    platform.cli("bind", "orders", "--topic", topic, "--function", "tests.funcs.ledger:record",
                 "--retry-ladder", LADDER)
    platform.start("scheduler")
    platform.start("delay")
    platform.start("tailers", None, "--batch-size", "500")

    def second_attempts() -> int:
        return sum(c.attempt == 2 for c in ledger.read(platform.ledger))

    wait_until(lambda: second_attempts() >= total // 5, 120, "a fifth of the retries ran")
    platform.kill("delay")
    killed_at = second_attempts()
    platform.start("delay", "delay2")
    wait_until(lambda: {c.id for c in ledger.read(platform.ledger) if c.attempt == 2}
               >= set(range(total)), 120, "every retry ran after the restart")
    runs = calls_by_id(platform.ledger)
    for i in range(total):
        first = next(c.at for c in runs[i] if c.attempt == 1)
        for c in runs[i]:
            if c.attempt == 2:
                assert c.at >= first + 1.0, f"record {i} ran again {c.at - first:.3f}s later"
    duplicates = second_attempts() - total
    print(f"\nkilled after {killed_at} retries; {duplicates} retried twice after the restart")


def test_the_default_ladder_is_shown_for_a_binding_bound_without_one(
        platform: Platform, unique_topic: Callable[..., str]) -> None:
    platform.cli("bind", "plain", "--topic", unique_topic(1), "--function",
                 "tests.funcs.ledger:record")
    (shown,) = json.loads(platform.cli("bindings", "--json").stdout)
    assert shown["retry_ladder"] == "30s,1m,5m,30m"
    assert shown["retry_ladder_s"] == [30.0, 60.0, 300.0, 1800.0]
