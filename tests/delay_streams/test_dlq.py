"""``asynctier dlq list | show | replay`` on the real Kafka, with a scheduler in the test."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from asynctier.cli import main
from asynctier.delay_streams.dlq import list_dead_letters
from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from tests.funcs import delay as delayfuncs
from tests.funcs import ledger
from tests.funcs.delay import LocalScheduler
from tests.platform_harness import read_topic


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ledger the test functions write to."""
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("ASYNCTIER_TEST_LEDGER", str(path))
    monkeypatch.setattr(ledger, "_fd", None)
    return path


@pytest.fixture
def scheduler() -> Iterator[LocalScheduler]:
    """A scheduler in this process."""
    local = LocalScheduler({})
    local.start()
    yield local
    local.stop()


def cli(settings: Settings, scheduler: LocalScheduler | None, *args: str) -> Result:
    """Run ``asynctier ARGS`` in this process with the test's settings."""
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_CONFIG": ""}
    if scheduler is not None:
        env["ASYNCTIER_SCHEDULERS"] = scheduler.address
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def dead_letters(settings: Settings, name: str, docs: list[Any],
                 ladder: tuple[float, ...] = (1.0, 2.0, 4.0)) -> Binding:
    """Bind ``name`` and put one dead letter per doc (bytes as they are, others as JSON)."""
    binding = Binding(name=name, source=Source("kafka", f"{settings.prefix}.src"),
                      function="tests.funcs.ledger:record",
                      retries=Retries(ladder_s=ladder, max_attempts=3))
    BindingRegistry(settings).put(binding)
    ensure_binding_topics(settings, [binding])
    handoff = Handoff(settings)
    for i, doc in enumerate(docs):
        value = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        parcel = Parcel(value=value, key=f"k{i}".encode(), headers=[("trace", b"x")],
                        origin=f"{binding.source.topic}/0/{i}", attempt=3,
                        first_seen_ms=1_700_000_000_000)
        handoff.dead_letter(binding, parcel, "max_attempts", f"boom {i}", 3)
    handoff.confirm()
    return binding


def test_list_and_show(settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 0}, b"\xff\x00binary"])
    result = cli(settings, None, "dlq", "list", "orders", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["offset"], r["key"], r["attempts"], r["reason"], r["error"]) for r in rows] == [
        (0, "k0", 3, "max_attempts", "boom 0"),
        (1, "k1", 3, "max_attempts", "boom 1")]
    assert rows[0]["first_seen"] == "2023-11-14T22:13:20.000Z"
    text = cli(settings, None, "dlq", "list", "orders")
    assert "boom 1" in text.output and "2 dead letter(s)" in text.output

    shown = json.loads(cli(settings, None, "dlq", "show", "orders", "1", "--json").output)
    assert shown["value_encoding"] == "base64"
    assert base64.b64decode(shown["value"]) == b"\xff\x00binary"
    assert {"name": "trace", "value": "x"} in shown["headers"]
    plain = cli(settings, None, "dlq", "show", "orders", "0")
    assert '{"id": 0}' in plain.output and "asynctier.attempts-made: 3" in plain.output

    missing = cli(settings, None, "dlq", "show", "orders", "7")
    assert missing.exit_code == 2 and "offsets 0 to 1 exist" in missing.output
    raw = cli(settings, None, "dlq", "show", "orders", "1", "--raw")
    assert raw.exit_code == 0 and raw.stdout_bytes == b"\xff\x00binary"
    both = cli(settings, None, "dlq", "show", "orders", "1", "--raw", "--json")
    assert both.exit_code == 2 and "give one of them" in both.output


def test_show_cuts_a_long_value_and_raw_prints_it_whole(settings: Settings) -> None:
    """A dead letter may be 64 MB: ``dlq show`` prints the start of a long value and says
    how to get the rest; ``--raw`` and ``--json`` give it whole."""
    from asynctier.cli.dlq import SHOW_VALUE_CHARS

    value = ("".join(f"{i:07d}," for i in range(5_000))).encode()  # 40,000 bytes
    dead_letters(settings, "orders", [value])
    text = cli(settings, None, "dlq", "show", "orders", "0")
    assert text.exit_code == 0, text.output
    assert "value (utf-8, 40,000 bytes):" in text.output
    assert value[:SHOW_VALUE_CHARS].decode() in text.output
    assert value[SHOW_VALUE_CHARS:SHOW_VALUE_CHARS + 8].decode() not in text.output
    assert f"the first {SHOW_VALUE_CHARS:,} of 40,000 characters" in text.output
    assert "dlq show orders 0 --raw" in text.output
    assert cli(settings, None, "dlq", "show", "orders", "0", "--raw").stdout_bytes == value
    shown = json.loads(cli(settings, None, "dlq", "show", "orders", "0", "--json").output)
    assert shown["value"] == value.decode()
    unknown = cli(settings, None, "dlq", "list", "nobody")
    assert unknown.exit_code == 2 and "no dead-letter topic" in unknown.output


def test_replay_after_a_fix_runs_each_once_and_a_second_replay_redoes_nothing(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    count = 300
    dead_letters(settings, "orders", [{"id": i, "always_fail": True} for i in range(count)])
    scheduler.functions["orders"] = delayfuncs.fixed

    dry = cli(settings, scheduler, "dlq", "replay", "orders", "--dry-run")
    assert "would replay 300" in dry.output and ledger.read(ledger_file) == []

    first = cli(settings, scheduler, "dlq", "replay", "orders", "--canary", "5")
    assert first.exit_code == 0, first.output
    assert "replayed 300 of 300" in first.output and "300 ok" in first.output
    calls = ledger.read(ledger_file)
    assert sorted(c.id for c in calls) == list(range(count))
    assert {c.attempt for c in calls} == {1}
    dlq_partition = f"{delayfuncs.FIXED}{settings.names.dlq_topic('orders')}/0"
    assert {c.source.rsplit("/", 1)[0] for c in calls} == {dlq_partition}

    second = cli(settings, scheduler, "dlq", "replay", "orders")
    assert second.exit_code == 0 and "replayed 0 of 0" in second.output
    assert len(ledger.read(ledger_file)) == count

    again = cli(settings, scheduler, "dlq", "replay", "orders", "--from-start", "--limit", "10")
    assert "replayed 10 of 10" in again.output
    assert len(ledger.read(ledger_file)) == count + 10


def test_purge_deletes_what_a_bulk_replay_passed_and_all_only_when_asked(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    dead_letters(settings, "orders", [{"id": i, "always_fail": True} for i in range(5)])
    scheduler.functions["orders"] = delayfuncs.fixed
    assert "deleted 0 dead letter(s) of orders; 5 kept" in cli(
        settings, scheduler, "dlq", "purge", "orders").output  # nothing replayed yet
    assert cli(settings, scheduler, "dlq", "replay", "orders", "--limit", "3").exit_code == 0
    done = cli(settings, scheduler, "dlq", "purge", "orders")
    assert done.exit_code == 0, done.output
    assert "deleted 3 dead letter(s) of orders; 2 kept (from offset 3)" in done.output
    assert [x.offset for x in list_dead_letters(settings, "orders")] == [3, 4]
    refused = cli(settings, scheduler, "dlq", "purge", "orders", "--all")
    assert refused.exit_code != 0 and "add --yes" in refused.output
    assert len(list_dead_letters(settings, "orders")) == 2
    everything = cli(settings, scheduler, "dlq", "purge", "orders", "--all", "--yes")
    assert "deleted 2 dead letter(s) of orders; 0 kept (from offset 5)" in everything.output
    assert list_dead_letters(settings, "orders") == []


def test_a_failing_canary_stops_the_replay_and_its_records_go_back_through_the_ladder(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    dead_letters(settings, "orders", [{"id": i, "always_fail": True} for i in range(50)])
    scheduler.functions["orders"] = ledger.record
    result = cli(settings, scheduler, "dlq", "replay", "orders", "--canary", "3")
    assert result.exit_code == 1
    assert "replayed 3 of 50" in result.output and "canary: 3 of 3" in result.output
    assert len(ledger.read(ledger_file)) == 3
    retried = read_topic(settings, settings.names.delay_topic("1s"))
    assert sorted(m.key() for m in retried) == [b"k0", b"k1", b"k2"]  # type: ignore[attr-defined]
    nxt = cli(settings, scheduler, "dlq", "replay", "orders", "--dry-run")
    assert "would replay 47" in nxt.output and "offsets 3 to 49" in nxt.output


def test_replay_stops_when_replays_start_failing_and_keeps_to_its_rate(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    docs = [{"id": i, "always_fail": i >= 20} for i in range(100)]
    dead_letters(settings, "orders", docs)
    scheduler.functions["orders"] = ledger.record
    started = time.monotonic()
    result = cli(settings, scheduler, "dlq", "replay", "orders", "--batch-size", "10",
                 "--window", "20", "--max-failure-ratio", "0.5", "--rate", "50")
    elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert "replays are failing: 10 of the last 20" in result.output
    assert "replayed 30 of 100" in result.output and "20 ok, 10 retried" in result.output
    assert elapsed >= 30 / 50 - 0.2


def test_a_rate_spreads_the_replay_instead_of_sending_bursts(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    """``--rate 5`` with batches of 100: each call carries at most 5 records, so 12 dead
    letters start over about 2 s, not all at once after a wait."""
    dead_letters(settings, "orders", [{"id": i} for i in range(12)])
    scheduler.functions["orders"] = ledger.record
    result = cli(settings, scheduler, "dlq", "replay", "orders", "--rate", "5")
    assert result.exit_code == 0, result.output
    starts = sorted(c.at for c in ledger.read(ledger_file))
    assert len(starts) == 12
    assert starts[-1] - starts[0] >= 1.0, starts  # before: one call, all within a moment
    per_second = max(sum(1 for t in starts if s <= t < s + 0.5) for s in starts)
    assert per_second <= 5, starts


@pytest.mark.parametrize(("option", "value"), [("--rate", "0"), ("--batch-size", "0"),
                                               ("--limit", "0"), ("--window", "0"),
                                               ("--max-failure-ratio", "2")])
def test_replay_options_out_of_range_are_refused(settings: Settings, option: str,
                                                 value: str) -> None:
    result = cli(settings, None, "dlq", "replay", "orders", option, value)
    assert result.exit_code == 2 and option in result.output, result.output


def test_a_listing_holds_no_values_and_show_reads_one_whole(settings: Settings) -> None:
    from asynctier.delay_streams.dlq import list_dead_letters, show_dead_letter

    dead_letters(settings, "orders", [{"id": i, "pad": "x" * 1000} for i in range(3)])
    listed = list_dead_letters(settings, "orders")
    assert len(listed) == 3 and all(letter.value is None for letter in listed)
    whole = show_dead_letter(settings, "orders", listed[1].offset)
    assert whole.value is not None and json.loads(whole.value)["id"] == 1


def test_replay_with_no_scheduler_says_so_and_stops(settings: Settings, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-off replay with no scheduler configured or registered fails at once saying
    what to do, and one with schedulers that do not answer gives up (a tailer would wait
    for one; a command must not hang)."""
    from asynctier.platform import rpc

    monkeypatch.setattr(rpc, "GIVE_UP_S", 2.0)
    dead_letters(settings, "orders", [{"id": 1}])
    config = tmp_path / "asynctier.toml"

    def replay(schedulers: str) -> Result:
        config.write_text(f"[asynctier]\nschedulers = [{schedulers}]\n")
        env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
               "ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
               "ASYNCTIER_CONFIG": str(config)}
        results: list[Result] = []
        worker = threading.Thread(target=lambda: results.append(CliRunner().invoke(
            main, ["dlq", "replay", "orders"], env=env)), daemon=True)
        worker.start()
        worker.join(60)
        assert results, "dlq replay hung with no scheduler to send to"
        return results[0]

    none = replay("")
    assert none.exit_code != 0
    assert "no scheduler is configured or registered" in none.output, none.output
    silent = replay('"127.0.0.1:9"')  # nothing listens there
    assert silent.exit_code != 0
    assert "no scheduler answered for 2s" in silent.output, silent.output
