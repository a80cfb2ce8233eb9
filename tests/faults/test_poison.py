"""Bad input never stops a process: poison records among good ones, bad function paths and
garbage in the bindings topic. Every good record runs, every bad one is a dead letter with
its reason, and every process is still alive (and stops cleanly) at the end.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import fastavro
from confluent_kafka import Producer

from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.names import (
    H_ATTEMPT,
    H_ATTEMPTS_MADE,
    H_BINDING,
    H_DUE,
    H_FIRST_SEEN,
    H_ORIGIN,
    H_REASON,
)
from asynctier.platform.registry import BindingRegistry
from tests.faults.checker import Report, early_retries, succeeded
from tests.faults.harness import FaultPlatform, make_docs, produce, wait_resolved
from tests.helpers import wait_until
from tests.platform_harness import read_topic

SCHEMA = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}
BIG = 1_200_000  # over 1 MB


def _avro(doc: dict[str, int]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(SCHEMA), doc)
    return buf.getvalue()


def _produce(settings: Settings, topic: str,
             records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "message.max.bytes": 8 * 1024 * 1024})
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(60) == 0


def _dlq_keys(settings: Settings, binding: str) -> dict[bytes | None, dict[str, bytes]]:
    return {m.key(): dict(m.headers() or ())  # type: ignore[attr-defined]
            for m in read_topic(settings, settings.names.dlq_topic(binding))}


def test_poison_records_and_bad_bindings(settings: Settings, tmp_path: Path,
                                         unique_topic: Callable[..., str], records: int,
                                         fault_results: list[Report]) -> None:
    plat = FaultPlatform(settings, tmp_path)
    try:
        _scenario(plat, settings, unique_topic, records, fault_results)
    finally:
        plat.stop_all()


def _scenario(plat: FaultPlatform, settings: Settings, unique_topic: Callable[..., str],
              records: int, fault_results: list[Report]) -> None:
    big = {"max.message.bytes": str(4 * 1024 * 1024)}
    topic, avro_topic = unique_topic(2, big), unique_topic(1)
    n = records
    poison: dict[bytes, bytes | None] = {
        b"bad-json": b"{not json",
        b"not-utf8": b'{"id": 1, "x": "\xff\xfe"}',
        b"tombstone": None,
        b"big-bad": b"[" + b"1," * (BIG // 2),
    }
    good_extra = [(b"\xff\xfe-key", json.dumps({"id": n}).encode()),  # a non-UTF-8 key runs
                  (b"big-good", json.dumps({"id": n + 1, "pad": "x" * BIG}).encode())]
    docs = make_docs(n)
    produce(settings, topic, docs[: n // 2])
    _produce(settings, topic, [*poison.items(), *good_extra])
    produce(settings, topic, docs[n // 2:])
    _produce(settings, avro_topic, [(b"a0", _avro({"id": n + 2})), (b"bad-avro", b"\x01\x02"),
                                    (b"avro-tomb", None), (b"a1", _avro({"id": n + 3}))])
    plat.bind("mixed", topic)
    plat.cli("bind", "orders-avro", "--topic", avro_topic, "--function",
             "tests.faults.funcs:run", "--format", "avro", "--schema",
             str(_schema_file(plat.folder)))
    fn_topic = unique_topic(1)
    _produce(settings, fn_topic, [(b"f1", b'{"id": -1}')])
    plat.cli("bind", "missing-fn", "--topic", fn_topic, "--function", "tests.faults.funcs:nope")
    outside = Binding(name="outside", source=Source("kafka", fn_topic),
                      function="tests.funcs.evil:run")
    ensure_binding_topics(settings, [outside])
    BindingRegistry(settings).put(outside)  # written by someone whose config allows more
    _garbage_bindings(settings)
    plat.start("scheduler")
    plat.start("delay")
    plat.start("tailers", None, "--batch-size", "500")
    ids = range(n + 4)
    wait_resolved(plat, ids, 180)
    wait_until(lambda: len(_dlq_keys(settings, "mixed")) >= len(poison), 60,
               "every poison record dead-lettered")
    wait_until(lambda: len(_dlq_keys(settings, "orders-avro")) >= 2, 60, "bad Avro dead-lettered")
    wait_until(lambda: _dlq_keys(settings, "missing-fn") and _dlq_keys(settings, "outside"), 60,
               "the bad function paths dead-lettered")
    mixed = _dlq_keys(settings, "mixed")
    avro = _dlq_keys(settings, "orders-avro")
    missing = _dlq_keys(settings, "missing-fn")[b"f1"]
    refused = _dlq_keys(settings, "outside")[b"f1"]
    assert set(mixed) == set(poison), set(mixed)
    assert set(avro) == {b"bad-avro", b"avro-tomb"}
    for headers in [*mixed.values(), *avro.values()]:
        assert headers["asynctier.reason"] == b"undecodable", headers
    assert b"function not found" in missing["asynctier.error"]
    assert b"module not allowed" in refused["asynctier.error"]
    assert not Path(str(plat.ledger) + ".imported").exists()
    calls = plat.calls()
    runs = succeeded(calls)
    lost = sorted(set(ids) - set(runs))
    lost_poison = (len(poison) - len(mixed)) + (2 - len(avro))
    dups = sum(c - 1 for c in runs.values() if c > 1)
    dead = {"undecodable": len(mixed) + len(avro), "function not found": 1,
            "module not allowed": 1}
    result = Report("poison records + bad bindings", len(ids) + len(poison) + 4, len(runs),
                    dead, 0, lost + [-1] * lost_poison, dups, early_retries(calls, (30.0,)), 0)
    fault_results.append(result)
    print("\n" + result.summary())
    assert all(plat.alive(p) for p in ("scheduler", "delay", "tailers"))
    for name in ("tailers", "delay", "scheduler"):
        assert plat.stop(name) == 0, plat.log(name)
    assert result.ok, result.summary()


def _schema_file(folder: Path) -> Path:
    path = folder / "order.avsc"
    path.write_text(json.dumps(SCHEMA))
    return path


def _garbage_bindings(settings: Settings) -> None:
    """Garbage in the bindings topic: bytes that are no Avro binding, a non-UTF-8 key, no key."""
    _produce(settings, settings.names.bindings_topic, [
        (b"garbage", b"\x00\xff\x13 not a binding"),
        (b"\xff\xfe", b"\x02\x04"),
        (None, b"no key at all"),
        (b"truncated", Binding(name="truncated", source=Source("kafka", "x"),
                               function="tests.faults.funcs:run").encode()[:7]),
    ])


def test_forged_platform_headers_neither_wedge_a_partition_nor_stop_a_process(
        settings: Settings, tmp_path: Path, unique_topic: Callable[..., str]) -> None:
    """A producer may write ``asynctier.*`` headers itself: attempts and times out of any
    range, an origin with a line break, a binding name no binding can have, a due time in
    the year 55,000. Each is read as absent: every record still runs (or is a dead letter
    with its reason), no delay partition stops moving, no process dies, and ``dlq list``
    shows a dead letter whose headers are garbage."""
    plat = FaultPlatform(settings, tmp_path)
    try:
        topic = unique_topic(1)
        plat.bind("forged", topic, "--retry-ladder", "1s,2s", "--max-attempts", "3")
        forged = [(H_ATTEMPT, b"99999999999"), (H_FIRST_SEEN, b"9" * 25),
                  (H_ORIGIN, b"x/0/1\nforged"), (H_DUE, b"1700000000000000")]
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
        for i in range(10):  # fail once, then succeed: through the 1s delay topic
            producer.produce(topic, json.dumps({"id": i, "fail_until": 2}).encode(),
                             str(i).encode(), headers=forged)
        delay_topic = settings.names.delay_topic("1s")
        producer.produce(delay_topic, b'{"id": 10}', b"10", headers=[
            (H_BINDING, b"no such/binding"), (H_ATTEMPT, b"2"), (H_DUE, b"0")])
        producer.produce(delay_topic, b'{"id": 11}', b"11", headers=[
            (H_BINDING, b"forged"), (H_ATTEMPT, b"2"), (H_DUE, b"1700000000000000"),
            (H_FIRST_SEEN, b"-5"), (H_ORIGIN, b"\n")])
        producer.produce(settings.names.dlq_topic("forged"), b'{"id": 12}', b"12", headers=[
            (H_ATTEMPTS_MADE, "²".encode()), (H_FIRST_SEEN, b"9" * 18),
            (H_REASON, b"rejected")])
        assert producer.flush(30) == 0
        plat.start("scheduler")
        plat.start("delay")
        plat.start("tailers")
        wait_resolved(plat, [*range(10), 11], 90)
        runs = succeeded(plat.calls())
        assert all(runs.get(i) == 1 for i in [*range(10), 11]), runs
        attempts = {(c.id, c.attempt) for c in plat.calls()}
        assert {(i, 2) for i in range(10)} <= attempts  # the ladder's attempt 2, not 1e11
        wait_until(lambda: any(m.key() == b"10" for m in  # type: ignore[attr-defined]
                               read_topic(settings, settings.names.dlq_topic("_unbound"))),
                   30, "the record of an impossible binding name dead-lettered")
        listed = json.loads(plat.cli("dlq", "list", "forged", "--json").stdout)
        assert [row["attempts"] for row in listed] == [0], listed
        assert all(plat.alive(p) for p in ("scheduler", "delay", "tailers"))
        for name in ("tailers", "delay", "scheduler"):
            assert plat.stop(name) == 0, plat.log(name)
    finally:
        plat.stop_all()
