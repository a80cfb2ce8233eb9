"""Issue 32, per-key order: ``bind --ordering key`` on the real processes (``asynctier run
scheduler | tailers | delay``), Kafka and Redis. CI runs 2,000 records over 100 keys; the
100,000-record scenarios are ``--long``."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import BindingError
from asynctier.tailers.parking import ParkingLot
from tests.funcs import order as orderfuncs
from tests.helpers import wait_until
from tests.platform_harness import Platform, committed_vs_end, produce_json, read_topic

LADDER = "3s,6s"  # a parked key waits >= 9 s: long enough to see main lag 0 meanwhile


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.order",))
    # a 30 s session: on a loaded machine a 6 s one loses the partitions mid-run
    (tmp_path / "asynctier.toml").write_text(
        f'[kafka]\n"bootstrap.servers" = "{settings.kafka_bootstrap}"\n'
        '"session.timeout.ms" = "30000"\n"heartbeat.interval.ms" = "3000"\n')
    yield plat
    plat.stop_all()


def keyed_docs(total: int, keys: int, failing: float, seed: int = 7) -> list[dict[str, object]]:
    """``total`` records over ``keys`` keys, each with its per-key seq; ``failing`` of them
    fail twice (attempts 1 and 2), then succeed."""
    rng = random.Random(seed)
    seqs: dict[str, int] = {}
    docs: list[dict[str, object]] = []
    for _ in range(total):
        key = f"k{rng.randrange(keys)}"
        doc: dict[str, object] = {"key": key, "seq": seqs.get(key, 0)}
        seqs[key] = seqs.get(key, 0) + 1
        if rng.random() < failing:
            doc["fail_until"] = 3
        docs.append(doc)
    return docs


def lag_is_zero(settings: Settings, group: str, topic: str, total: int) -> bool:
    """The group committed every record (a coordinator moving meanwhile: not yet)."""
    try:
        return committed_vs_end(settings, group, topic) == (total, total)
    except KafkaException:
        return False


def all_ran(path: Path, docs: list[dict[str, object]]) -> bool:
    """Every record succeeded at least once."""
    done = {(s.key, s.seq) for s in orderfuncs.read(path)}
    return {(str(d["key"]), int(d["seq"])) for d in docs} <= done  # type: ignore[call-overload]


def run_ordered(platform: Platform, settings: Settings, topic: str, total: int, keys: int,
                kill: Callable[[], None] | None = None,
                timeout_s: float = 120.0) -> dict[str, object]:
    """Bind ``--ordering key``, produce, run; assert the order rule and that everything
    ran; return the figures. One more key, ``stuck``, fails its first record until the
    main topic's lag is 0: its later records wait parked meanwhile."""
    stuck = platform.folder / "stuck"
    stuck.write_text("")
    docs = keyed_docs(total, keys, 0.01)
    docs[:0] = [{"key": "stuck", "seq": 0, "fail_while": str(stuck)},
                {"key": "stuck", "seq": 1}]
    docs.append({"key": "stuck", "seq": 2})
    total = len(docs)
    produce_json(settings, topic, docs, key_of="key")
    platform.cli("bind", "ordered", "--topic", topic, "--function", "tests.funcs.order:step",
                 "--retry-ladder", LADDER, "--max-attempts", "50", "--ordering", "key")
    started = time.monotonic()
    platform.start("scheduler")
    platform.start("delay")
    platform.start("tailers", None, "--batch-size", "500")
    group = settings.names.group("ordered")
    lot = ParkingLot.of(settings, "ordered")
    if kill is not None:
        wait_until(lambda: len(orderfuncs.read(platform.ledger)) > total // 4, timeout_s,
                   "a quarter of the records ran")
        kill()
    wait_until(lambda: lag_is_zero(settings, group, topic, total), timeout_s,
               "the main group's lag reached 0")
    rows = json.loads(platform.cli("lag", "--binding", "ordered", "--json").stdout)
    parked_at_zero = next(r["parked_keys"] for r in rows if r["kind"] == "parked")
    wanted = {(str(d["key"]), int(d["seq"])) for d in docs}  # type: ignore[call-overload]
    done_at_zero = len(wanted & {(s.key, s.seq) for s in orderfuncs.read(platform.ledger)})
    stuck.unlink()
    wait_until(lambda: all_ran(platform.ledger, docs), timeout_s, "every record succeeded")
    drained_s = time.monotonic() - started
    assert orderfuncs.out_of_offset_order(platform.ledger) == [], (
        "a key's records ran out of offset order")
    assert orderfuncs.out_of_order(platform.ledger) == [], (
        "a key's records ran in offset order but the topic holds them out of the order "
        "produced: see produce_json")
    firsts = orderfuncs.first_successes(platform.ledger)
    per_key: dict[str, int] = {}
    for doc in docs:
        per_key[str(doc["key"])] = per_key.get(str(doc["key"]), 0) + 1
    assert {k: len(v) for k, v in firsts.items() if k in per_key} == per_key
    wait_until(lambda: lot.stats().keys == 0, 30, "no key is parked once all ran")
    return {"parked_at_zero": parked_at_zero, "done_at_zero": done_at_zero,
            "drained_s": drained_s, "failing": sum("fail_until" in d for d in docs)}


def bind_dead_letter_case(platform: Platform, topic: str) -> list[dict[str, object]]:
    """A second binding: key ``a``'s first record is a dead letter after 2 attempts."""
    docs: list[dict[str, object]] = [{"key": "a", "seq": 0, "fail_until": 99},
                                     {"key": "a", "seq": 1}, {"key": "a", "seq": 2},
                                     {"key": "b", "seq": 0}]
    produce_json(platform.settings, topic, docs, key_of="key")
    platform.cli("bind", "dead", "--topic", topic, "--function", "tests.funcs.order:step",
                 "--retry-ladder", "1s", "--max-attempts", "2", "--ordering", "key")
    return docs


def check_dead_letter_case(platform: Platform, topic: str) -> None:
    """Key ``a``'s later records ran after its dead letter, which names them."""
    settings = platform.settings
    wait_until(lambda: {("a", 1), ("a", 2), ("b", 0)} <= {
        (s.key, s.seq) for s in orderfuncs.read(platform.ledger)}, 60, "a#1, a#2, b#0 ran")
    firsts = orderfuncs.first_successes(platform.ledger)
    assert firsts["a"] == [1, 2] and firsts["b"] == [0]
    letters = wait_until(lambda: read_topic(settings, settings.names.dlq_topic("dead")), 30,
                         "the dead letter")
    assert len(letters) == 1
    headers = dict(letters[0].headers())  # type: ignore[attr-defined]
    ran_after = headers[n.H_RAN_AFTER].decode()
    assert "2 record(s)" in ran_after and f"{topic}/0/1, {topic}/0/2" in ran_after, ran_after
    assert json.loads(letters[0].value())["seq"] == 0  # type: ignore[attr-defined]


def test_keys_run_in_order_retries_park_only_their_key(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    dead_topic = unique_topic(1)
    bind_dead_letter_case(platform, dead_topic)
    figures = run_ordered(platform, settings, unique_topic(4), 2_000, 100)
    print(f"\nordered 2,000/100 keys: {figures}")
    assert figures["parked_at_zero"], "main lag reached 0 only once no key was parked"
    assert figures["done_at_zero"] < 2_003  # type: ignore[operator]
    check_dead_letter_case(platform, dead_topic)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_100k_records_over_1000_keys_in_order(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    figures = run_ordered(platform, settings, unique_topic(4), 100_000, 1_000,
                          timeout_s=900)
    print(f"\nordered 100,000/1,000 keys: {figures}")
    assert figures["parked_at_zero"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_100k_in_order_across_a_tailer_and_a_scheduler_sigkill(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    def kill() -> None:
        platform.kill("tailers")
        platform.start("tailers", "tailers2", "--batch-size", "500")
        platform.kill("scheduler")
        platform.start("scheduler", "scheduler2")

    figures = run_ordered(platform, settings, unique_topic(4), 100_000, 1_000, kill=kill,
                          timeout_s=900)
    print(f"\nordered 100,000/1,000 keys, SIGKILLs: {figures}")


def drain_span(path: Path, topic: str, skip_key: str | None) -> float:
    """Seconds from the first to the last first success of ``topic``'s records (the key
    ``skip_key`` left out)."""
    times = [s.at for s in orderfuncs.read(path)
             if s.source.startswith(f"{topic}/") and s.key != skip_key]
    return max(times) - min(times)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_key_failing_for_60s_does_not_slow_the_other_999(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    total, keys = 100_000, 1_000
    base, hot = unique_topic(4), unique_topic(4)
    docs = keyed_docs(total, keys, 0.0)
    produce_json(settings, base, docs, key_of="key")
    platform.start("scheduler")
    platform.start("delay")
    platform.start("tailers", None, "--batch-size", "500")
    platform.cli("bind", "base", "--topic", base, "--function", "tests.funcs.order:step",
                 "--retry-ladder", "5s", "--max-attempts", "100", "--ordering", "key")
    wait_until(lambda: sum(s.source.startswith(f"{base}/")
                           for s in orderfuncs.read(platform.ledger)) >= total, 900,
               "the run without a failing key drained")
    t0 = time.time()
    failing = [dict(d, fail_for_s=60, t0=t0) if d["key"] == "k0" else d for d in docs]
    produce_json(settings, hot, failing, key_of="key")
    platform.cli("bind", "hot", "--topic", hot, "--function", "tests.funcs.order:step",
                 "--retry-ladder", "5s", "--max-attempts", "100", "--ordering", "key")
    others = sum(d["key"] != "k0" for d in docs)
    wait_until(lambda: sum(s.source.startswith(f"{hot}/") and s.key != "k0"
                           for s in orderfuncs.read(platform.ledger)) >= others, 900,
               "the other 999 keys drained")
    without = drain_span(platform.ledger, base, "k0")
    with_hot = drain_span(platform.ledger, hot, "k0")
    print(f"\nother 999 keys: {without:.1f}s without the failing key, {with_hot:.1f}s with it")
    assert with_hot <= without * 1.10
    wait_until(lambda: len(orderfuncs.first_successes(platform.ledger, hot).get("k0", []))
               == sum(d["key"] == "k0" for d in docs), 300, "k0 ran too")
    assert orderfuncs.out_of_order(platform.ledger, base) == []
    assert orderfuncs.out_of_order(platform.ledger, hot) == []


def test_ordering_key_is_refused_where_order_cannot_be_kept() -> None:
    """A queue binding, or a Kafka binding whose timeout moves its records into the
    queue, cannot keep a key's order: bind refuses --ordering key, saying what to change."""
    kafka = Binding("o", Source("kafka", "t"), "tests.funcs.order:run",
                    execution=Execution(ordering="key"))
    assert kafka.validate() is kafka
    with pytest.raises(BindingError, match="a queue orders by priority"):
        kafka.with_changes(source=replace(kafka.source, kind="queue")).validate()
    with pytest.raises(BindingError, match="lower --timeout or raise --queue-after"):
        kafka.with_changes(execution=replace(kafka.execution, timeout_s=120.0)).validate()
