"""The scheduler over gRPC: one outcome per item, for every way a function can end."""

from __future__ import annotations

import io
import json
import os
import sys
import uuid

import fastavro
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Payload, Source
from asynctier.platform.config import Settings
from asynctier.scheduler import SchedulerOptions
from tests.funcs import basic
from tests.scheduler_harness import Running, item, items, running_scheduler

SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "sku", "type": "string"}]})

BINDINGS = [
    Binding("rec", Source("kafka", "t"), "tests.funcs.basic:record", tenant="acme"),
    Binding("arec", Source("kafka", "t"), "tests.funcs.basic:async_record"),
    Binding("retry", Source("kafka", "t"), "tests.funcs.basic:retry_later"),
    Binding("reject", Source("kafka", "t"), "tests.funcs.basic:reject"),
    Binding("areject", Source("kafka", "t"), "tests.funcs.basic:async_reject"),
    Binding("boom", Source("kafka", "t"), "tests.funcs.basic:boom"),
    Binding("aboom", Source("kafka", "t"), "tests.funcs.basic:async_boom"),
    Binding("slow", Source("kafka", "t"), "tests.funcs.basic:sleepy",
            execution=Execution(timeout_s=0.3)),
    Binding("aslow", Source("kafka", "t"), "tests.funcs.basic:async_sleepy",
            execution=Execution(timeout_s=0.3)),
    Binding("avro", Source("kafka", "t"), "tests.funcs.basic:record",
            payload=Payload(format="avro", schema=SCHEMA)),
    Binding("raw", Source("kafka", "t"), "tests.funcs.basic:record",
            payload=Payload(format="bytes")),
    Binding("evil", Source("kafka", "t"), "tests.funcs.evil:run"),
    Binding("system", Source("kafka", "t"), "os:system"),
    Binding("walk", Source("kafka", "t"), "tests.funcs.basic:time.sleep"),
    Binding("missing", Source("kafka", "t"), "tests.funcs.basic:nope"),
    Binding("nomod", Source("kafka", "t"), "tests.funcs.basic.nomodule:run"),
    Binding("outside", Source("kafka", "t"), "tests.funcs.nomodule:run"),
]


@pytest.fixture(scope="module")
def sched(kafka_bootstrap: str, redis_url: str) -> Running:  # type: ignore[misc]
    settings = Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                        prefix="t" + uuid.uuid4().hex[:10])
    os.environ.pop("ASYNCTIER_TEST_EVIL_IMPORTED", None)
    with running_scheduler(settings, BINDINGS, options=SchedulerOptions(workers=4)) as run:
        yield run


def avro(doc: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(SCHEMA)), doc)
    return buf.getvalue()


def test_ok_sync_and_async_with_context(sched: Running) -> None:
    basic.reset()
    batch = [item("rec", 1, b'{"n": 1}', attempt=3, key=b"k1",
                  headers=[{"name": "h", "value": b"v"}, {"name": "empty", "value": None}]),
             item("arec", 2, b'{"n": 2}')]
    outcomes = sched.submit(batch)
    assert [outcomes[i]["status"] for i in (1, 2)] == ["ok", "ok"]
    seen = {payload["n"]: ctx for payload, ctx in basic.SEEN}
    ctx = seen[1]
    assert (ctx.binding, ctx.key, ctx.attempt, ctx.tenant) == ("rec", b"k1", 3, "acme")
    assert ctx.headers == (("h", b"v"), ("empty", None))
    assert ctx.source == "topic/0/1"
    assert ctx.record_time == pytest.approx(1_700_000_000.001)
    assert ctx.deadline > ctx.record_time
    assert seen[2].binding == "arec"


def test_retry_reject_and_exceptions(sched: Running) -> None:
    outcomes = sched.submit([item("retry", 1), item("reject", 2), item("areject", 3),
                             item("boom", 4), item("aboom", 5)])
    assert outcomes[1] == {"id": 1, "status": "retry", "after_s": 7.0,
                           "error": "not ready yet", "spends_attempt": True, "reason": None}
    assert outcomes[2]["status"] == "failed" and outcomes[2]["error"] == "bad order"
    assert outcomes[2]["reason"] == outcomes[3]["reason"] == "rejected"
    assert outcomes[3]["status"] == "failed" and outcomes[3]["error"] == "async bad order"
    boom = outcomes[4]
    assert boom["status"] == "retry" and boom["after_s"] is None and boom["spends_attempt"]
    assert boom["error"] is not None and boom["error"].startswith("ValueError: boom xxx")
    assert len(boom["error"]) <= 500
    assert outcomes[5]["status"] == "retry"
    assert outcomes[5]["error"] == "KeyError: 'missing'"


def test_timeouts_sync_and_async(sched: Running) -> None:
    batch = [item("slow", 1, b'{"sleep": 1.0}'), item("slow", 2, b'{"sleep": 0.0}'),
             item("aslow", 3, b'{"sleep": 1.0}'), item("aslow", 4, b'{"sleep": 0.0}')]
    outcomes = sched.submit(batch)
    for late in (1, 3):
        assert outcomes[late]["status"] == "retry"
        assert outcomes[late]["error"] == "timed out after 0.3s"
        assert outcomes[late]["reason"] == "timeout"
    assert outcomes[2]["status"] == "ok" and outcomes[4]["status"] == "ok"


def test_a_hung_item_does_not_hold_the_rest_of_its_chunk(sched: Running) -> None:
    batch = [item("slow", 1, b'{"sleep": 3.0}')] + [
        item("slow", n, b'{"sleep": 0.0}') for n in range(2, 12)]
    outcomes = sched.submit(batch)
    assert outcomes[1]["error"] == "timed out after 0.3s"
    assert all(outcomes[n]["status"] == "ok" for n in range(2, 12))


def test_undecodable_payloads_are_failed_at_once(sched: Running) -> None:
    batch = [item("rec", 1, b"{not json"), item("rec", 2, b"\xff\xfe\x00"),
             item("rec", 3, None), item("avro", 4, b"\x02"),
             item("avro", 5, avro({"id": 1, "sku": "a"}) + b"extra"), item("avro", 6, None),
             item("avro", 7, avro({"id": 7, "sku": "ok"})), item("raw", 8, None),
             item("raw", 9, b"\xff")]
    outcomes = sched.submit(batch)
    for bad in (1, 2, 3, 4, 5, 6):
        assert outcomes[bad]["status"] == "failed", outcomes[bad]
        assert (outcomes[bad]["error"] or "").startswith("undecodable: ")
        assert outcomes[bad]["reason"] == "undecodable"
    assert outcomes[3]["error"] == "undecodable: tombstone: the record has no value"
    assert outcomes[6]["error"] == "undecodable: tombstone: the record has no value"
    assert "UTF-8" in (outcomes[2]["error"] or "")
    assert "left over" in (outcomes[5]["error"] or "")
    assert [outcomes[n]["status"] for n in (7, 8, 9)] == ["ok", "ok", "ok"]


def test_avro_and_bytes_payloads_reach_the_function(sched: Running) -> None:
    basic.reset()
    sched.submit([item("avro", 1, avro({"id": 41, "sku": "x"})), item("raw", 2, b"\x00\x01"),
                  item("raw", 3, None)])
    payloads = {ctx.binding + str(ctx.source): p for p, ctx in basic.SEEN}
    assert payloads["avrotopic/0/1"] == {"id": 41, "sku": "x"}
    assert payloads["rawtopic/0/2"] == b"\x00\x01"
    assert payloads["rawtopic/0/3"] is None


def test_modules_not_allowed_are_never_imported(sched: Running) -> None:
    outcomes = sched.submit([item("evil", 1), item("system", 2), item("walk", 3)])
    assert outcomes[1]["status"] == "failed"
    assert (outcomes[1]["error"] or "").startswith("module not allowed: tests.funcs.evil")
    assert "--allow-module tests.funcs.evil" in (outcomes[1]["error"] or "")
    assert "tests.funcs.evil" not in sys.modules
    assert "ASYNCTIER_TEST_EVIL_IMPORTED" not in os.environ
    assert (outcomes[2]["error"] or "").startswith("module not allowed: os")
    assert (outcomes[3]["error"] or "").startswith("module not allowed: tests.funcs.basic:time")


def test_unknown_functions_fail(sched: Running) -> None:
    outcomes = sched.submit([item("missing", 1), item("nomod", 2), item("outside", 3)])
    assert outcomes[1]["status"] == "failed"
    assert outcomes[1]["error"] == ("function not found: tests.funcs.basic:nope: "
                                    "no attribute 'nope'")
    assert outcomes[2]["status"] == "failed"
    assert outcomes[2]["error"] == ("function not found: tests.funcs.basic.nomodule:run: "
                                    "no module named tests.funcs.basic.nomodule")
    # tests.funcs.nomodule is outside tests.funcs.basic: refused before any import
    assert (outcomes[3]["error"] or "").startswith("module not allowed: tests.funcs.nomodule")


def test_unknown_binding_comes_back_without_spending_an_attempt(sched: Running) -> None:
    outcomes = sched.submit([item("nobody", 1), item("rec", 2)])
    assert outcomes[1]["status"] == "retry" and outcomes[1]["after_s"] == 5.0
    assert outcomes[1]["spends_attempt"] is False
    assert "unknown binding 'nobody'" in (outcomes[1]["error"] or "")
    assert outcomes[2]["status"] == "ok"


def test_big_mixed_batch_gets_every_outcome(sched: Running) -> None:
    batch = items("rec", 3000) + [item("boom", 10_000 + n) for n in range(500)]
    outcomes = sched.submit(batch)
    statuses = [o["status"] for o in outcomes.values()]
    assert statuses.count("ok") == 3000 and statuses.count("retry") == 500


class _Custom(Exception):
    def __init__(self, n: int) -> None:
        super().__init__("same args")
        self.n = n

    def __str__(self) -> str:
        return f"custom {self.n}"


def test_error_text_is_the_exception_text_whether_remembered_or_not() -> None:
    from asynctier.scheduler.outcomes import MAX_ERROR, error_text

    for _ in range(2):  # the second round comes from memory where it may
        assert error_text(RuntimeError("boom")) == "RuntimeError: boom"
        assert error_text(ValueError("boom")) == "ValueError: boom"
        assert error_text(RuntimeError(True)) == "RuntimeError: True"
        assert error_text(RuntimeError(1)) == "RuntimeError: 1"
        assert error_text(RuntimeError([1])) == "RuntimeError: [1]"
        assert error_text(_Custom(1)) == "_Custom: custom 1"
        assert error_text(_Custom(2)) == "_Custom: custom 2"
        long = error_text(RuntimeError("x" * 2000))
        assert len(long) == MAX_ERROR and long.endswith("...")


def test_a_plain_exception_is_a_retry_along_the_ladder_with_its_text() -> None:
    from asynctier.platform import wire
    from asynctier.scheduler.outcomes import of_exception

    for _ in range(2):  # remembered the second time
        assert of_exception(7, RuntimeError("boom")) == wire.retry(7, "RuntimeError: boom")
        assert of_exception(8, KeyError("k", "v")) == wire.retry(8, "KeyError: ('k', 'v')")
        assert of_exception(9, ValueError()) == wire.retry(9, "ValueError: ")
        assert of_exception(3, _Custom(3)) == wire.retry(3, "_Custom: custom 3")
