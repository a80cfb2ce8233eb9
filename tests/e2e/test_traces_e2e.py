"""Traces end to end, read back from a real Jaeger: a record produced inside a producer's
span, failing twice and then succeeding through the delay topics, is one trace of three
attempts; a record with a malformed ``traceparent`` runs in a trace of its own, the
warning said once for its binding; a queue item submitted through the SDK inside an
application's span is in that span's trace, and its replay after it died is a trace of
its own, linked to it."""

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
from tests.submitter_harness import SubmitterPlatform


@pytest.fixture
def platform(settings: Settings, tmp_path: Path, jaeger: JaegerNode) -> Iterator[Platform]:
    """The test's processes, tracing on (the standard variables), spans to Jaeger."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.traced",), env={
        **TRACING_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint})
    yield plat
    plat.stop_all()


TRACING_ENV = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "asynctier-test",
               "OTEL_BSP_SCHEDULE_DELAY": "200"}


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
    topic, isolated, slow = unique_topic(1), unique_topic(1), unique_topic(1)
    platform.cli("bind", "pay", "--topic", topic, "--function", "tests.funcs.traced:charge",
                 "--retry-ladder", "1s,2s", "--max-attempts", "3")
    platform.cli("bind", "iso", "--topic", isolated, "--function",
                 "tests.funcs.traced:charge", "--retry-ladder", "1s", "--isolation", "process")
    platform.cli("bind", "slow", "--topic", slow, "--function", "tests.funcs.traced:charge",
                 "--rate", "2", "--burst", "1")
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
        headers = [(k, v.encode()) for k, v in carrier.items()]
        _produce(settings, topic, [(json.dumps({"id": 1, "fail": 2}).encode(), headers)])
        _produce(settings, isolated, [(json.dumps({"id": 5, "fail": 1}).encode(), headers)])
    provider.shutdown()
    context = send.get_span_context()
    trace_id, send_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    waits = _produce(settings, slow, [(json.dumps({"id": n}).encode(), []) for n in (6, 7, 8)])
    bad = _produce(settings, topic, [(json.dumps({"id": n}).encode(),
                                      [("traceparent", b"00-not-a-trace-context")])
                                     for n in (2, 3, 4)])

    wait_until(lambda: len(calls(platform.ledger)) == 11, 90,
               "three attempts, six records, and two attempts in a worker process")
    assert {c["trace"] for c in calls(platform.ledger) if c["id"] in (1, 5)} == {trace_id}
    spans = _trace_with(jaeger, trace_id, lambda s: sum(
        x["operationName"] == "charge" for x in s) == 5 and sum(
        x["operationName"] == "process pay" for x in s) == 3 and sum(
        x["operationName"] == "read pay" for x in s) == 3 and any(
        x["operationName"] == "process iso" and _tags(x).get("asynctier.outcome") == "ok"
        for x in s))
    by_id = {s["spanID"]: s for s in spans}
    attempts = sorted((s for s in spans if s["operationName"] == "process pay"),
                      key=lambda s: s["startTime"])
    assert [_tags(a)["asynctier.attempt"] for a in attempts] == [1, 2, 3]
    assert [_tags(a)["asynctier.outcome"] for a in attempts] == ["retry", "retry", "ok"]
    assert all(_parent(a) == send_id for a in attempts)  # the producer's span is the parent
    # each attempt read by a tailer (the main one, then the delay tailers) before it ran
    reads = sorted((s for s in spans if s["operationName"] == "read pay"),
                   key=lambda s: s["startTime"])
    assert [_tags(r)["asynctier.attempt"] for r in reads] == [1, 2, 3]
    assert all(_parent(r) == send_id for r in reads)
    for read, attempt in zip(reads, attempts, strict=True):
        assert read["startTime"] <= attempt["startTime"] + 1000  # us: read, then run
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
    # in a worker process (--isolation process) the run and the function's span nest alike
    # (on a loaded machine a call can be sent again while the worker process starts: the
    # resent attempt is skipped or abandoned, a span without a run)
    every = [s for s in spans if s["operationName"] == "process iso"]
    ran = {s["spanID"]: [r for r in spans if _parent(r) == s["spanID"]] for s in every}
    isos = sorted((s for s in every if ran[s["spanID"]]), key=lambda s: s["startTime"])
    assert [_tags(s)["asynctier.outcome"] for s in isos] == ["retry", "ok"], [
        _tags(s) for s in every]
    for attempt in isos:
        [run] = ran[attempt["spanID"]]
        assert [c["operationName"] for c in spans if _parent(c) == run["spanID"]] == ["charge"]

    # a malformed traceparent: the record runs in a trace of its own, said once
    own = trace_id_of([], bad[0])
    assert own != trace_id
    first = _trace_with(jaeger, own, lambda s: any(x["operationName"] == "charge" for x in s))
    roots = [s for s in first if s["operationName"] == "process pay"]
    assert len(roots) == 1 and _parent(roots[0]) is None
    assert platform.log("scheduler", 1_000_000).count("is not W3C trace context") == 1

    # a rate-limited binding's records wait for their tokens: the wait is on their spans
    waited: list[float] = []
    for ref in waits:
        found = _trace_with(jaeger, trace_id_of([], ref), lambda s: any(
            x["operationName"] == "process slow" for x in s))
        waited += [w for s in found for w in _waits(s, "waited at TokenGate")]
    assert waited and max(waited) >= 300, waited  # 2 a second, a burst of 1: 500 ms apart


def _waits(span: dict[str, Any], event: str) -> list[float]:
    """The ``asynctier.waited_ms`` of a span's events called ``event``."""
    found = []
    for log in span.get("logs", ()):
        fields = {f["key"]: f["value"] for f in log["fields"]}
        if fields.get("event") == event:
            found.append(float(fields["asynctier.waited_ms"]))
    return found


def _exporting(jaeger: JaegerNode, service: str) -> TracerProvider:
    """An application's own provider, its spans sent to the test's Jaeger at once."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=jaeger.endpoint, insecure=True)))
    return provider


def test_a_replayed_queue_item_is_a_trace_linked_to_its_first(
        settings: Settings, tmp_path: Path, postgres: str, jaeger: JaegerNode,
        queue_namespace: str) -> None:
    plat = SubmitterPlatform(settings, tmp_path, [postgres])
    plat.allow = ["tests.funcs.traced"]
    plat.extra_env.update({**TRACING_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint})
    try:
        plat.cli("bind", "bill", "--queue", "bills", "--tenant", queue_namespace,
                 "--function", "tests.funcs.traced:charge", "--max-attempts", "2",
                 "--retry-ladder", "1s")
        plat.start("scheduler")
        plat.start("tailers")
        plat.start_submitter()
        provider = _exporting(jaeger, "checkout")
        with provider.get_tracer("checkout").start_as_current_span("checkout") as app, \
                plat.client() as client:
            client.submit("bill", {"id": 7, "fail": 99}, id="bill-7")
        provider.shutdown()
        trace_id = f"{app.get_span_context().trace_id:032x}"
        app_id = f"{app.get_span_context().span_id:016x}"

        def state() -> str:
            shown = plat.cli("queue", "show", "bills", "bill-7", "-n", queue_namespace,
                             "--json").stdout
            doc: dict[str, Any] = json.loads(shown)
            return str(doc["state"]) if doc["trace"] == trace_id else "wrong trace"
        wait_until(lambda: state() == "dead", 60, "the item dead after two attempts")
        first = _trace_with(jaeger, trace_id, lambda s: sum(
            x["operationName"] == "process bill" for x in s) == 2)
        attempts = sorted((s for s in first if s["operationName"] == "process bill"),
                          key=lambda s: s["startTime"])
        assert all(_parent(a) == app_id for a in attempts)
        assert [_tags(a)["asynctier.outcome"] for a in attempts] == ["retry", "dead"]
        assert _tags(attempts[0])["asynctier.queue.item_id"] == "bill-7"

        plat.cli("queue", "replay", "bills", "-n", queue_namespace)
        wait_until(lambda: len([c for c in calls(plat.ledger) if c["id"] == 7]) == 3, 60,
                   "the replayed item ran")
        replay_trace = [c["trace"] for c in calls(plat.ledger) if c["id"] == 7][-1]
        assert replay_trace != trace_id
        replayed = _trace_with(jaeger, replay_trace, lambda s: any(
            x["operationName"] == "process bill" for x in s))
        root = next(s for s in replayed if s["operationName"] == "process bill")
        assert _parent(root) is None
        links = [r for r in root["references"] if r["refType"] == "FOLLOWS_FROM"]
        assert [(r["traceID"], r["spanID"]) for r in links] == [(trace_id, app_id)]
    finally:
        plat.stop_all()

