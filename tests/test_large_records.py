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
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers import kafka as tailer_module
from asynctier.tailers.kafka import KafkaTailer, TailerOptions
from tests.faults.checker import read_ledger, succeeded
from tests.faults.harness import FaultPlatform, produce
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end

CAP = 50_000
PAD = 9_000  # each record's JSON is a little over 9 kB: 5 fit under the cap


def _entries(sizes: list[tuple[int, int]]) -> list[release.Entry]:
    """One entry per (value size, header size)."""
    binding = Binding("big", "big", "tests.faults.funcs:run")
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
    parts = release._parts(entries, CAP)
    assert [e for part in parts for e in part] == entries
    for part in parts:
        total = sum(len(e.item["payload"] or b"")
                    + sum(len(h["name"]) + len(h["value"] or b"") for h in e.item["headers"])
                    for e in part)
        assert total <= CAP or len(part) == 1


def _calls(client: SchedulerClient, method: str) -> list[int]:
    """Wrap ``client.<method>``: the number of items of each call."""
    counts: list[int] = []
    real = getattr(client, method)

    def counted(*args: Any) -> Any:
        counts.append(len(args[0]) if method == "submit" else args[1])
        return real(*args)

    setattr(client, method, counted)
    return counts


@pytest.mark.parametrize("large", ["values", "headers"])
def test_a_tailer_cuts_a_batch_of_large_records_into_calls_under_the_cap(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch, large: str) -> None:
    """Records of about 9 kB of value, or small values with 9 kB of headers."""
    monkeypatch.setattr(tailer_module, "MAX_CALL_BYTES", CAP)
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
    plat = FaultPlatform(settings, tmp_path)
    stop = threading.Event()
    thread = None
    try:
        plat.bind("big", topic)
        plat.start("scheduler")
        binding = BindingRegistry(settings).load()["big"]
        client = SchedulerClient(lambda: [f"127.0.0.1:{plat.ports['scheduler']}"])
        calls = _calls(client, "submit_encoded")
        tailer = KafkaTailer(settings, binding, client, TailerOptions(batch_size=1000))
        thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
        thread.start()
        wait_until(lambda: committed_vs_end(settings, settings.names.group("big"), topic)
                   == (n, n), 60, "every record committed")
    finally:
        stop.set()
        if thread is not None:
            thread.join(60)
        plat.stop_all()
    assert sum(calls) == n and max(calls) <= CAP // PAD, calls
    runs = succeeded(read_ledger(plat.ledger))
    assert sorted(runs) == list(range(n)) and set(runs.values()) == {1}


def test_a_delay_or_replay_batch_of_large_records_goes_in_several_calls(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "MAX_CALL_BYTES", CAP)
    plat = FaultPlatform(settings, tmp_path)
    try:
        plat.bind("big", unique_topic(1))
        plat.start("scheduler")
        client = SchedulerClient(lambda: [f"127.0.0.1:{plat.ports['scheduler']}"])
        calls = _calls(client, "submit")
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
