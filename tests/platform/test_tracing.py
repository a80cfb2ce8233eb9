"""Trace context as records carry it: W3C traceparent parsing, the context derived for a
record without one, and the [tracing] settings."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

from asynctier.platform import names as n
from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.platform.tracing import (
    TracingSettings,
    derived_parent,
    parse_traceparent,
    record_trace,
    trace_id_of,
    with_current_context,
)

GOOD = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_w3c_traceparent_parses() -> None:
    parent = parse_traceparent(GOOD, b"congo=t61rcWkgMzE")
    assert parent is not None
    assert parent.trace_hex == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parent.span_id == 0x00F067AA0BA902B7
    assert parent.sampled and parent.state == "congo=t61rcWkgMzE"
    assert parent.traceparent() == GOOD
    unsampled = parse_traceparent(GOOD[:-2] + b"00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize("value", [
    b"", b"garbage", GOOD[:-1], GOOD.upper(),
    b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
    b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
    GOOD + b"-extra",  # version 00 has no more fields
    b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
])
def test_a_malformed_traceparent_is_refused(value: bytes) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_may_carry_more_fields() -> None:
    parent = parse_traceparent(b"01" + GOOD[2:] + b"-what-comes-later")
    assert parent is not None and parent.trace_hex == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_every_attempt_of_a_record_without_context_derives_the_same_parent() -> None:
    first = record_trace([], "orders/3/1200")
    again = record_trace([(n.H_ATTEMPT, b"3")], "orders/3/1200")
    other = record_trace([], "orders/3/1201")
    assert first.derived and first == again
    assert first.parent != other.parent
    assert trace_id_of([], "orders/3/1200") == first.parent.trace_hex


def test_a_producers_context_is_the_parent_and_a_malformed_one_is_named() -> None:
    given_ = record_trace([("traceparent", GOOD)], "orders/0/1")
    assert not given_.derived and given_.parent.trace_hex.startswith("4bf92f35")
    bad = record_trace([("traceparent", b"00-nope")], "orders/0/1")
    assert bad.derived and bad.malformed == "00-nope"
    assert bad.parent == record_trace([], "orders/0/1").parent


def test_a_replay_starts_its_own_trace_linked_to_the_original() -> None:
    original = record_trace([("traceparent", GOOD)], "orders/0/7")
    replay = record_trace([("traceparent", GOOD), (n.H_REPLAYED, b"42")], "orders/0/7")
    assert replay.derived and replay.link == original.parent
    assert replay.parent.trace_id != original.parent.trace_id
    second = record_trace([("traceparent", GOOD), (n.H_REPLAYED, b"43")], "orders/0/7")
    assert second.parent != replay.parent  # each replay its own trace
    plain = record_trace([(n.H_REPLAYED, b"42")], "queue/ns/jobs/a1")
    assert plain.link == record_trace([], "queue/ns/jobs/a1").parent


@given(st.text(min_size=1, max_size=40), st.sampled_from([0.0, 0.01, 0.25, 0.5, 1.0]))
def test_a_derived_parent_is_sampled_as_the_sdk_samples_its_trace_id(
        origin: str, ratio: float) -> None:
    parent = derived_parent(origin, ratio)
    decision = TraceIdRatioBased(ratio).should_sample(None, parent.trace_id, "x").decision
    assert parent.sampled == (decision == Decision.RECORD_AND_SAMPLE)


def test_tracing_settings_from_the_table_and_the_environment() -> None:
    settings = Settings.from_mapping({"tracing": {"enabled": True, "sample_ratio": 0.01,
                                                  "endpoint": "http://collector:4317"}})
    assert settings.tracing == TracingSettings(True, "http://collector:4317", 0.01)
    assert not Settings().tracing.enabled
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://j:4317",
           "OTEL_TRACES_SAMPLER_ARG": "0.5", "OTEL_SERVICE_NAME": "billing"}
    on = Settings().from_env(env).tracing
    assert on == TracingSettings(True, "http://j:4317", 0.5, "billing")
    assert not Settings().from_env({**env, "OTEL_SDK_DISABLED": "true"}).tracing.enabled
    with pytest.raises(ConfigError, match="sample_ratio"):
        Settings.from_mapping({"tracing": {"sample_ratio": 2}})
    with pytest.raises(ConfigError, match="unknown key"):
        Settings.from_mapping({"tracing": {"enable": True}})


def test_no_tracing_code_is_imported_while_tracing_is_off() -> None:
    # redis-py imports OpenTelemetry's API and metrics by itself when they are installed;
    # the tracing SDK, the exporter and our spans are imported only when tracing is on
    code = ("import sys\n"
            "import asynctier.cli, asynctier.client, asynctier.scheduler.server\n"
            "import asynctier.tailers.manager, asynctier.submitter.server\n"
            "loaded = sorted(m for m in sys.modules if m.startswith(("
            "'opentelemetry.sdk.trace', 'opentelemetry.exporter', "
            "'asynctier.scheduler.traces', 'asynctier.platform.tracing_sdk', "
            "'asynctier.platform.tracing_read')))\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_the_sdk_sends_the_applications_current_span() -> None:
    assert with_current_context((("a", b"1"),)) == (("a", b"1"),)  # no span: nothing added
    provider = TracerProvider()
    with provider.get_tracer("app").start_as_current_span("checkout") as span:
        headers = with_current_context((("a", b"1"),))
        given = with_current_context((("traceparent", GOOD),))
    context = span.get_span_context()
    parent = parse_traceparent(dict(headers)["traceparent"])
    assert parent is not None and parent.trace_id == context.trace_id
    assert parent.span_id == context.span_id and parent.sampled
    assert given == (("traceparent", GOOD),)  # a context the caller set is kept


def test_a_dead_letter_shows_the_trace_of_where_it_was_first_read() -> None:
    headers = [(n.H_ORIGIN, b"orders/2/99"), (n.H_REASON, b"max_attempts")]
    assert trace_id_of(headers, "asynctier.dlq.pay/0/5") == trace_id_of([], "orders/2/99")


def test_a_trace_url_must_name_the_trace() -> None:
    table = {"trace_url": "http://jaeger:16686/trace/{trace_id}"}
    settings = TracingSettings.from_table(table, "t")
    assert settings.trace_link("ab12") == "http://jaeger:16686/trace/ab12"
    assert TracingSettings().trace_link("ab12") == ""
    for bad in ("http://jaeger:16686/search", "javascript:alert(1)//{trace_id}"):
        with pytest.raises(ConfigError, match="trace_url"):
            TracingSettings.from_table({"trace_url": bad}, "t")
