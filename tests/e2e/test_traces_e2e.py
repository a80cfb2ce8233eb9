"""Traces end to end, read back from a real Jaeger: a record produced inside a producer's
span, failing twice and then succeeding through the delay topics, is one trace of three
attempts; a record with a malformed ``traceparent`` runs in a trace of its own, the
warning said once for its binding."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from asynctier.dev import JaegerNode
from asynctier.platform.config import Settings
from asynctier.platform.tracing import trace_id_of
from tests.funcs.traced import calls
from tests.helpers import wait_until
from tests.platform_harness import Platform


@pytest.fixture
def platform(settings: Settings, tmp_path: Path, jaeger: JaegerNode) -> Iterator[Platform]:
    """The test's processes, tracing on (the standard variables), spans to Jaeger."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.traced",), env={
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint,
        "OTEL_SERVICE_NAME": "asynctier-test", "OTEL_BSP_SCHEDULE_DELAY": "200"})
    yield plat
    plat.stop_all()


def _produce(settings: Settings, topic: str, records: list[tuple[bytes, list[Any]]]
             ) -> list[str]:
    """Produce (value, headers) records; their source references (topic/partition/offset)."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    refs: list[str] = []

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        refs.append(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")

    for value, headers in records:
        producer.produce(topic, value, headers=headers, on_delivery=done)
    assert producer.flush(30) == 0
    return refs


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", ())}


def _parent(span: dict[str, Any]) -> str | None:
    refs = [r for r in span.get("references", ()) if r["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def _trace_with(jaeger: JaegerNode, trace_id: str, ready: Callable[[list[dict[str, Any]]], bool]
                ) -> list[dict[str, Any]]:
    seen: list[str] = []

    def spans() -> list[dict[str, Any]] | None:
        found = jaeger.trace(trace_id)
        seen[:] = [s["operationName"] for s in found["spans"]] if found else []
        return found["spans"] if found and ready(found["spans"]) else None
    try:
        got: list[dict[str, Any]] = wait_until(spans, 60, f"trace {trace_id} in Jaeger")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its spans: {seen}; services: {jaeger.services()}"
                             ) from None
    return got


def test_a_record_that_fails_twice_is_one_trace_of_three_attempts(
        platform: Platform, settings: Settings, jaeger: JaegerNode,
        unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    platform.cli("bind", "pay", "--topic", topic, "--function", "tests.funcs.traced:charge",
                 "--retry-ladder", "1s,2s", "--max-attempts", "3")
    for name in ("scheduler", "tailers", "delay"):
        platform.start(name)
    # the producer's own span, exported to the same Jaeger by the test
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=jaeger.endpoint, insecure=True)))
    with provider.get_tracer("shop").start_as_current_span("send order",
                                                           kind=SpanKind.PRODUCER) as send:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, set_span_in_context(send))
        _produce(settings, topic, [(json.dumps({"id": 1, "fail": 2}).encode(),
                                    [(k, v.encode()) for k, v in carrier.items()])])
    provider.shutdown()
    context = send.get_span_context()
    trace_id, send_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    bad = _produce(settings, topic, [(json.dumps({"id": n}).encode(),
                                      [("traceparent", b"00-not-a-trace-context")])
                                     for n in (2, 3, 4)])

    wait_until(lambda: len(calls(platform.ledger)) == 6, 90, "three attempts and three records")
    assert {c["trace"] for c in calls(platform.ledger) if c["id"] == 1} == {trace_id}
    spans = _trace_with(jaeger, trace_id, lambda s: sum(
        x["operationName"] == "charge" for x in s) == 3 and sum(
        x["operationName"] == "process pay" for x in s) == 3)
    by_id = {s["spanID"]: s for s in spans}
    attempts = sorted((s for s in spans if s["operationName"] == "process pay"),
                      key=lambda s: s["startTime"])
    assert [_tags(a)["asynctier.attempt"] for a in attempts] == [1, 2, 3]
    assert [_tags(a)["asynctier.outcome"] for a in attempts] == ["retry", "retry", "ok"]
    assert all(_parent(a) == send_id for a in attempts)  # the producer's span is the parent
    assert by_id[send_id]["operationName"] == "send order"
    # the delay hops are the gaps between the attempts: 1 s, then 2 s of the ladder
    for before, after, hop_s in ((attempts[0], attempts[1], 1), (attempts[1], attempts[2], 2)):
        gap_s = (after["startTime"] - before["startTime"] - before["duration"]) / 1e6
        assert gap_s >= hop_s * 0.9, (hop_s, gap_s)
    for attempt in attempts:
        runs = [s for s in spans if _parent(s) == attempt["spanID"]]
        assert [r["operationName"] for r in runs] == ["run tests.funcs.traced:charge"]
        charges = [s for s in spans if _parent(s) == runs[0]["spanID"]]
        assert [c["operationName"] for c in charges] == ["charge"]
        assert _tags(attempt)["messaging.destination.name"] == topic
        assert _tags(attempt)["asynctier.binding"] == "pay"
    assert "card declined (attempt 2)" in json.dumps(attempts[1])

    # a malformed traceparent: the record runs in a trace of its own, said once
    own = trace_id_of([], bad[0])
    assert own != trace_id
    first = _trace_with(jaeger, own, lambda s: any(x["operationName"] == "charge" for x in s))
    roots = [s for s in first if s["operationName"] == "process pay"]
    assert len(roots) == 1 and _parent(roots[0]) is None
    assert platform.log("scheduler", 1_000_000).count("is not W3C trace context") == 1
