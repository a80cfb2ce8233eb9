"""The metrics module: names and labels by convention, batch helpers, the HTTP endpoint."""

from __future__ import annotations

import re
import urllib.request
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from asynctier.platform import metrics

ALLOWED_LABELS = {"binding", "tenant", "outcome", "component", "tier", "step", "reason",
                  "group", "topic", "partition", "state", "region", "task"}


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _fresh(kind: str) -> str:
    """A label value no other test used, so counters start at zero."""
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def test_names_follow_prometheus_conventions() -> None:
    for name, metric in metrics.ALL_METRICS.items():
        assert re.fullmatch(r"asynctier_[a-z_]+", name), name
        if isinstance(metric, Counter):
            assert name.endswith("_total"), name
        if isinstance(metric, Histogram):
            assert name.endswith("_seconds"), name
        if isinstance(metric, Gauge):
            assert not name.endswith("_total"), name
        labels = set(metric._labelnames)
        assert labels <= ALLOWED_LABELS, (name, labels - ALLOWED_LABELS)
        assert len(labels) <= 3, name


def test_every_metric_of_the_issue_is_defined() -> None:
    wanted = {
        "asynctier_items_total": ("binding", "tenant", "outcome"),
        "asynctier_function_duration_seconds": ("binding",),
        "asynctier_record_to_start_seconds": ("binding",),
        "asynctier_in_flight_items": ("component", "binding"),
        "asynctier_parked_keys": ("binding",),
        "asynctier_parked_oldest_seconds": ("binding",),
        "asynctier_scheduler_queue_depth": ("tier",),
        "asynctier_throttled_total": ("binding",),
        "asynctier_quota_delayed_total": ("binding", "tenant"),
        "asynctier_concurrency_waits_total": ("binding",),
        "asynctier_redis_fallback_total": ("binding",),
        "asynctier_retries_total": ("binding", "step"),
        "asynctier_dead_letters_total": ("binding", "reason"),
        "asynctier_consumer_lag": ("group", "topic", "partition"),
        "asynctier_consumer_lag_seconds": ("group", "topic", "partition"),
        "asynctier_delay_backlog": ("topic",),
        "asynctier_live_schedulers": (),
        "asynctier_batches_total": ("component", "binding"),
        "asynctier_handoff_failures_total": ("topic",),
        "asynctier_run_once_total": ("binding", "outcome"),
        "asynctier_submitter_workloads_total": ("binding", "tenant", "outcome"),
        "asynctier_submitter_refused_calls_total": ("binding", "reason"),
        "asynctier_submitter_call_seconds": ("binding",),
        "asynctier_queue_items": ("binding", "tenant", "state"),
        "asynctier_checkpoints_total": ("binding", "outcome"),
        "asynctier_queue_leases_lost_total": ("binding", "reason"),
        "asynctier_queue_longest_run_seconds": ("binding", "tenant"),
        "asynctier_queue_oldest_ready_seconds": ("binding", "tenant"),
        "asynctier_queue_lease_expiries_total": ("binding", "tenant"),
        "asynctier_expired_total": ("binding",),
        "asynctier_breaker_state": ("binding",),
        "asynctier_breaker_parked_total": ("binding",),
        "asynctier_breaker_probes_total": ("binding",),
        "asynctier_deferred_total": ("binding",),
        "asynctier_scheduler_saturated": (),
        "asynctier_region_calls_total": ("region", "reason"),
        "asynctier_tailer_restarts_total": ("binding", "reason"),
        "asynctier_task_restarts_total": ("task", "reason"),
        "asynctier_schedule_firings_total": ("outcome",),
        "asynctier_schedule_lateness_seconds": (),
        "asynctier_schedule_clock_offset_seconds": (),
    }
    assert {n: tuple(m._labelnames) for n, m in metrics.ALL_METRICS.items()} == wanted


def test_record_outcomes_counts_a_batch_with_one_call() -> None:
    binding = _fresh("b")
    metrics.record_outcomes(binding, "acme", {"ok": 97, "retry": 3, "failed": 0})
    metrics.record_outcomes(binding, "acme", {"ok": 3})
    assert _value("asynctier_items_total", binding=binding, tenant="acme", outcome="ok") == 100
    assert _value("asynctier_items_total", binding=binding, tenant="acme",
                  outcome="retry") == 3
    # a zero count creates no series
    assert REGISTRY.get_sample_value("asynctier_items_total", {
        "binding": binding, "tenant": "acme", "outcome": "failed"}) is None


def test_unknown_outcome_or_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown outcome"):
        metrics.record_outcomes("b", "t", {"okay": 1})
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        metrics.record_dead_letters("b", {"boom": 1})


def test_histograms_take_a_batch_of_observations() -> None:
    binding = _fresh("b")
    metrics.observe_durations(binding, [0.002, 0.2, 3.0])
    metrics.observe_record_ages(binding, [1_000_000, 1_000_500], start_s=1_001.0)
    assert _value("asynctier_function_duration_seconds_count", binding=binding) == 3
    assert _value("asynctier_function_duration_seconds_sum", binding=binding) == \
        pytest.approx(3.202)
    assert _value("asynctier_record_to_start_seconds_count", binding=binding) == 2
    assert _value("asynctier_record_to_start_seconds_sum", binding=binding) == \
        pytest.approx(1.5)
    assert _value("asynctier_record_to_start_seconds_bucket", binding=binding,
                  le="0.5") == 1


def test_retries_dead_letters_and_limits() -> None:
    binding = _fresh("b")
    metrics.record_retries(binding, {"30s": 4, 1: 2})
    metrics.record_dead_letters(binding, {"max_attempts": 2, "undecodable": 1})
    metrics.count_throttled(binding, 5)
    metrics.count_quota_delayed(binding, "acme", 6)
    metrics.count_concurrency_waits(binding, 7)
    metrics.count_redis_fallback(binding, 8)
    metrics.count_batch("tailer", binding)
    assert _value("asynctier_retries_total", binding=binding, step="30s") == 4
    assert _value("asynctier_retries_total", binding=binding, step="1") == 2
    assert _value("asynctier_dead_letters_total", binding=binding,
                  reason="max_attempts") == 2
    assert _value("asynctier_throttled_total", binding=binding) == 5
    assert _value("asynctier_quota_delayed_total", binding=binding, tenant="acme") == 6
    assert _value("asynctier_concurrency_waits_total", binding=binding) == 7
    assert _value("asynctier_redis_fallback_total", binding=binding) == 8
    assert _value("asynctier_batches_total", component="tailer", binding=binding) == 1


def test_gauges_set_and_forget() -> None:
    group = _fresh("g")
    metrics.set_consumer_lag(group, "t", 3, 42, 1.5)
    assert _value("asynctier_consumer_lag", group=group, topic="t", partition="3") == 42
    assert _value("asynctier_consumer_lag_seconds", group=group, topic="t",
                  partition="3") == 1.5
    metrics.forget_consumer_lag(group, "t", 3)
    metrics.forget_consumer_lag(group, "t", 3)  # twice is fine
    assert REGISTRY.get_sample_value("asynctier_consumer_lag", {
        "group": group, "topic": "t", "partition": "3"}) is None
    binding = _fresh("b")
    metrics.set_in_flight("tailer", binding, 10)
    metrics.add_in_flight("tailer", binding, -4)
    assert _value("asynctier_in_flight_items", component="tailer", binding=binding) == 6
    metrics.set_queue_depths({"urgent": 1, "normal": 2, "batch": 3})
    assert _value("asynctier_scheduler_queue_depth", tier="batch") == 3
    metrics.set_live_schedulers(2)
    assert _value("asynctier_live_schedulers") == 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(sorted(metrics.OUTCOMES)),
                                st.integers(0, 1000)), max_size=10))
def test_outcome_totals_are_the_sums_of_the_batches(batches: list[dict[str, int]]) -> None:
    binding = _fresh("p")
    for counts in batches:
        metrics.record_outcomes(binding, "t", counts)
    for outcome in metrics.OUTCOMES:
        expected = sum(c.get(outcome, 0) for c in batches)
        assert _value("asynctier_items_total", binding=binding, tenant="t",
                      outcome=outcome) == expected


def test_serve_picks_a_free_port_and_exports_every_metric() -> None:
    binding = _fresh("s")
    metrics.record_outcomes(binding, "t", {"ok": 1})
    port = metrics.serve(0, addr="127.0.0.1")
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus-client's parser drops the _total suffix of counter families
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in families.values()}
    assert set(metrics.ALL_METRICS) <= exported
    assert f'asynctier_items_total{{binding="{binding}",outcome="ok",tenant="t"}} 1.0' in text


def test_every_exported_series_name_is_known() -> None:
    names = metrics.exported_series_names()
    assert "asynctier_function_duration_seconds_bucket" in names
    assert "asynctier_items_total" in names
    assert "asynctier_consumer_lag_seconds" in names


def test_the_histogram_layout_read_on_the_hot_path_is_still_there() -> None:
    """If prometheus_client changes how a histogram child keeps its buckets, the chunk
    shortcut silently falls back to one observe per value: this says so instead."""
    from importlib.metadata import version

    from prometheus_client import CollectorRegistry, Histogram

    from asynctier.platform.metrics import HISTOGRAM_LAYOUT_CHECKED, _layout

    child = Histogram("layout_seconds", "d", buckets=(0.1, 1.0),
                      registry=CollectorRegistry())
    layout = _layout(child)
    assert layout is not None, (
        f"prometheus_client {version('prometheus-client')} no longer lays out a histogram "
        f"as {HISTOGRAM_LAYOUT_CHECKED} did: update metrics._layout")
    bounds, buckets, _ = layout
    assert list(bounds) == [0.1, 1.0, float("inf")] and len(buckets) == 3


def test_observing_many_values_at_once_equals_observing_each() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from asynctier.platform.metrics import _observe_many

    registry = CollectorRegistry()
    one = Histogram("one_seconds", "d", buckets=(0.01, 0.1, 1.0), registry=registry)
    many = Histogram("many_seconds", "d", buckets=(0.01, 0.1, 1.0), registry=registry)
    values = [0.0, 0.01, 0.011, 0.1, 0.5, 1.0, 3.0, 0.001]
    for v in values * 3:
        one.observe(v)
    _observe_many(many, values, repeat=3)

    def samples(name: str) -> dict[str, float]:
        return {s.name.removeprefix(name) + str(s.labels.get("le", "")): s.value
                for metric in registry.collect() if metric.name == name
                for s in metric.samples if not s.name.endswith("_created")}

    one_s, many_s = samples("one_seconds"), samples("many_seconds")
    assert one_s.pop("_sum") == pytest.approx(many_s.pop("_sum"))
    assert one_s == many_s


@settings(max_examples=200, deadline=None)
@given(ages_ms=st.lists(st.integers(-50, 4_000_000), min_size=1, max_size=40),
       start_ms=st.integers(1_700_000_000_000, 1_800_000_000_000))
def test_record_ages_of_a_chunk_land_as_if_observed_one_by_one(
        ages_ms: list[int], start_ms: int) -> None:
    """The one-bucket shortcut of observe_record_ages counts exactly what observing each
    record's age on its own would (ages clamped at 0: a clock a little ahead)."""
    from prometheus_client import CollectorRegistry

    binding = f"ages-{uuid.uuid4().hex[:8]}"
    start_s = start_ms / 1000.0
    record_ms = [start_ms - a for a in ages_ms]
    metrics.observe_record_ages(binding, record_ms, start_s)
    one = Histogram("one_seconds", "d", buckets=metrics.RECORD_TO_START_BUCKETS_S,
                    registry=CollectorRegistry())
    for ms in record_ms:
        one.observe(max(0.0, start_s - ms / 1000.0))
    got = {s.labels["le"]: s.value for m in REGISTRY.collect()
           if m.name == "asynctier_record_to_start_seconds"
           for s in m.samples if s.labels.get("binding") == binding and "le" in s.labels}
    want = {s.labels["le"]: s.value for m in one.collect() for s in m.samples
            if "le" in s.labels}
    assert got == want
    total = REGISTRY.get_sample_value("asynctier_record_to_start_seconds_sum",
                                      {"binding": binding})
    # The shortcut takes the difference of two sums near 40 x 1.8e9 s: a double keeps about
    # 1e-5 s of it (a tenth of a millisecond is far below what the histogram's sum tells).
    assert total == pytest.approx(sum(max(0.0, start_s - ms / 1000.0) for ms in record_ms),
                                  abs=1e-4)
