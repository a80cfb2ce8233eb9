"""Large records never make a submit call too big for gRPC (64 MB: a call over it fails at
every try, and its batch would never resolve). A tailer's batch, and a delay or replay
batch, is cut into calls of at most ``MAX_CALL_BYTES`` of record bytes. The cap is made
small here so that records of a few kB show it; every record still runs exactly once."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from asynctier.delay_streams import release
from asynctier.delay_streams.handoff import Parcel
from asynctier.platform import calls as calls_module
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.kafka import KafkaTailer, TailerOptions
from tests.faults.checker import read_ledger, succeeded
from tests.faults.harness import FaultPlatform, produce
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end, read_topic

CAP = 50_000
PAD = 9_000  # each record's JSON is a little over 9 kB: 5 fit under the cap


def _entries(sizes: list[tuple[int, int]]) -> list[release.Entry]:
    """One entry per (value size, header size)."""
    binding = Binding("big", Source("kafka", "big"), "tests.faults.funcs:run")
    return [release.make_entry(
        i, binding, Parcel(b"x" * size, None, [("trace", b"h" * extra)] if extra else [],
                           f"big/0/{i}", 1, 0), f"big/0/{i}")
        for i, (size, extra) in enumerate(sizes)]


@hsettings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 3 * CAP), st.sampled_from([0, 0, CAP // 3])),
                      max_size=40))
def test_parts_keep_every_entry_in_order_each_under_the_cap_or_alone(
        sizes: list[tuple[int, int]]) -> None:
    """Headers count: records with small values and large headers are cut too."""
    entries = _entries(sizes)
    parts = [entries[start:end] for start, end, _ in release.calls(entries, CAP)]
    assert [e for part in parts for e in part] == entries
    for part in parts:
        total = sum(len(e.item["payload"] or b"")
                    + sum(len(h["name"]) + len(h["value"] or b"") for h in e.item["headers"])
                    for e in part)
        assert total <= CAP or len(part) == 1


def _calls(client: SchedulerClient, method: str, counts: list[int] | None = None) -> list[int]:
    """Wrap ``client.<method>``: the number of items of each call (added to ``counts``)."""
    counts = [] if counts is None else counts
    real = getattr(client, method)

    def counted(*args: Any) -> Any:
        counts.append(len(args[0]) if method == "submit" else args[1])
        return real(*args)

    setattr(client, method, counted)
    return counts


def _tail_until_committed(settings: Settings, tmp_path: Path, name: str, topic: str, n: int,
                          options: TailerOptions, timeout_s: float,
                          wrap: Callable[[SchedulerClient], object] | None = None
                          ) -> FaultPlatform:
    """Bind ``name`` to ``topic``, start a scheduler process, and run a tailer in this
    process until the ``n`` records of ``topic`` are committed; ``wrap`` sees the client
    first. Returns the platform, stopped."""
    plat = FaultPlatform(settings, tmp_path)
    stop = threading.Event()
    thread = None
    try:
        plat.bind(name, topic)
        plat.start("scheduler")
        binding = BindingRegistry(settings).load()[name]
        client = SchedulerClient(lambda: [f"127.0.0.1:{plat.ports['scheduler']}"])
        if wrap is not None:
            wrap(client)
        tailer = KafkaTailer(settings, binding, client, options)
        thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
        thread.start()
        wait_until(lambda: committed_vs_end(settings, settings.names.group(name), topic)
                   == (n, n), timeout_s, "every record committed")
    finally:
        stop.set()
        if thread is not None:
            thread.join(60)
        plat.stop_all()
    return plat


@pytest.mark.parametrize("large", ["values", "headers"])
def test_a_tailer_cuts_a_batch_of_large_records_into_calls_under_the_cap(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch, large: str) -> None:
    """Records of about 9 kB of value, or small values with 9 kB of headers."""
    monkeypatch.setattr(calls_module, "MAX_CALL_BYTES", CAP)
    n = 60
    topic = unique_topic(1)
    if large == "values":
        produce(settings, topic, [{"id": i, "pad": "x" * PAD} for i in range(n)])
    else:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
        for i in range(n):
            producer.produce(topic, json.dumps({"id": i}).encode(), str(i).encode(),
                             headers=[("trace", b"t" * (PAD // 2)), ("span", b"s" * (PAD // 2))])
        assert producer.flush(30) == 0
    calls: list[int] = []
    plat = _tail_until_committed(settings, tmp_path, "big", topic, n,
                                 TailerOptions(batch_size=1000), 60,
                                 lambda client: _calls(client, "submit_encoded", calls))
    assert sum(calls) == n and max(calls) <= CAP // PAD, calls
    runs = succeeded(read_ledger(plat.ledger))
    assert sorted(runs) == list(range(n)) and set(runs.values()) == {1}


def test_a_delay_or_replay_batch_of_large_records_goes_in_several_calls(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls_module, "MAX_CALL_BYTES", CAP)
    plat = FaultPlatform(settings, tmp_path)
    try:
        plat.bind("big", unique_topic(1))
        plat.start("scheduler")
        client = SchedulerClient(lambda: [f"127.0.0.1:{plat.ports['scheduler']}"])
        calls = _calls(client, "submit_encoded")
        binding = BindingRegistry(settings).load()["big"]
        body = [b'{"id": %d, "pad": "%s"}' % (i, b"x" * PAD) for i in range(23)]
        entries = [release.make_entry(i, binding, Parcel(v, None, [], f"big/0/{i}", 1, 0),
                                      f"big/0/{i}") for i, v in enumerate(body)]
        outcomes = release.submit(client, entries, None)
        client.close()
    finally:
        plat.stop_all()
    assert [o["status"] for o in outcomes] == ["ok"] * 23
    assert [o["id"] for o in outcomes] == list(range(23))
    assert sum(calls) == 23 and len(calls) >= 5 and max(calls) <= CAP // PAD, calls
    assert sorted(succeeded(read_ledger(plat.ledger))) == list(range(23))


def test_a_record_too_large_for_any_call_is_a_dead_letter_kept_whole_and_the_rest_flows(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str]) -> None:
    """A topic configured past 64 MB holds a record no submit call can carry (gRPC refused
    it at every try, and its binding waited behind it for ever): it is not sent, it goes to
    the dead-letter topic whole (reason ``too_large``; the topic's limit raised to fit), and
    the records around it run and are committed."""
    big_bytes = 70 * 1024 * 1024
    topic = unique_topic(1, config={"max.message.bytes": str(90 * 1024 * 1024)})
    big = b'{"id": 1, "pad": "%s"}' % (b"x" * big_bytes)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "message.max.bytes": 95 * 1024 * 1024})
    n = 10
    for i in range(n):
        value = big if i == 1 else json.dumps({"id": i}).encode()
        producer.produce(topic, value, f"k{i}".encode())
    assert producer.flush(60) == 0
    del producer
    plat = _tail_until_committed(settings, tmp_path, "huge", topic, n, TailerOptions(), 90)
    runs = succeeded(read_ledger(plat.ledger))
    assert sorted(runs) == [i for i in range(n) if i != 1] and set(runs.values()) == {1}
    letters: list[Any] = read_topic(settings, settings.names.dlq_topic("huge"), 30.0)
    assert len(letters) == 1
    letter = letters[0]
    headers = dict(letter.headers() or [])
    assert letter.value() == big and letter.key() == b"k1"
    assert headers["asynctier.reason"] == b"too_large"
    assert headers["asynctier.error"].startswith(b"the record and its batch take")
    assert headers["asynctier.origin"] == f"{topic}/0/1".encode()


def test_a_call_too_large_to_send_is_answered_at_once_every_item_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from asynctier.delay_streams.handoff import Handoff
    from asynctier.platform import rpc
    from asynctier.platform.wire import TOO_LARGE

    monkeypatch.setattr(rpc, "MAX_REQUEST_BYTES", 5000)
    client = SchedulerClient(lambda: ["127.0.0.1:9"])

    def never(payload: bytes) -> Any:
        raise AssertionError("a call too large to send was sent")

    monkeypatch.setattr(client, "_send", never)
    item: Any = {"id": 7, "binding": "big", "payload": b"x" * 6000, "key": None,
                 "headers": [], "attempt": 1, "source_ref": "big/0/7", "record_time_ms": 0,
             "priority": 0, "deadline_ms": None}
    [outcome] = client.submit([item]).result()
    assert outcome["id"] == 7 and outcome["status"] == "failed"
    assert outcome["reason"] == TOO_LARGE and "not run" in (outcome["error"] or "")
    written: list[tuple[str, list[tuple[str, bytes | None]]]] = []

    class Producer_:
        def produce(self, topic: str, value: bytes | None, key: bytes | None,
                    headers: list[tuple[str, bytes | None]]) -> None:
            written.append((topic, headers))

    handoff = Handoff(Settings(), Producer_())  # type: ignore[arg-type]
    parcel = Parcel(b"x" * 6000, None, [], "big/0/7", 1, 0)
    big = Binding("big", Source("kafka", "big"), "m:f")
    assert handoff.resolve(big, parcel, outcome) == "dead_letter"
    assert dict(written[0][1])["asynctier.reason"] == TOO_LARGE.encode()
