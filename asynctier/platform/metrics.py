"""Every Prometheus metric the platform exports, and helpers that record a batch at once.

The metrics are module-level prometheus-client objects on the default registry: creating
them opens no socket and starts no thread. A process exposes them with :func:`serve`
(``--metrics-port``); nothing is served until it asks.

Names follow Prometheus conventions (``asynctier_`` prefix, ``_total`` for counters,
``_seconds`` for durations) and carry few, fixed labels: ``binding``, ``tenant``,
``outcome``, ``component``, ``tier``, ``step``, ``reason``, for lag ``group``,
``topic``, ``partition``, for the queue's depth ``topic`` and ``state``, for the
calls' placement ``region`` (where a call went), and for a process's background loops
``task``.

The hot path records a whole batch with one call per label set, never one call per item::

    metrics.record_outcomes("orders", "acme", {"ok": 97, "retry": 3})
    metrics.observe_durations("orders", durations_s)
    metrics.record_retries("orders", {"30s": 3})

A helper given an outcome or dead-letter reason outside :data:`OUTCOMES` /
:data:`DEAD_LETTER_REASONS` raises ValueError: labels stay a small fixed set.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

#: The ``outcome`` label of :data:`ITEMS`.
OUTCOMES: Final = frozenset({"ok", "retry", "failed", "dead_letter", "undecodable",
                             "moved", "parked"})  # parked: behind its key (--ordering key)
#: The ``reason`` label of :data:`DEAD_LETTERS`.
DEAD_LETTER_REASONS: Final = frozenset(
    {"undecodable", "rejected", "max_attempts", "function_error", "binding_removed",
     "too_large", "expired", "unknown_schema", "not_framed"}
)
#: Suggested ``component`` label values.
COMPONENTS: Final = ("tailer", "scheduler", "delay")

#: Function run time: from 1 ms to the longest timeout people set (minutes).
DURATION_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)
#: Record time to function start: milliseconds when keeping up, an hour and more after
#: retries through the delay ladder or a long outage.
RECORD_TO_START_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
)

ITEMS = Counter(
    "asynctier_items_total",
    "Items resolved, by binding, tenant and outcome.",
    ["binding", "tenant", "outcome"],
)
FUNCTION_DURATION = Histogram(
    "asynctier_function_duration_seconds",
    "Time the bound function ran for one item.",
    ["binding"],
    buckets=DURATION_BUCKETS_S,
)
RECORD_TO_START = Histogram(
    "asynctier_record_to_start_seconds",
    "Time from the record's timestamp to the start of the function on it.",
    ["binding"],
    buckets=RECORD_TO_START_BUCKETS_S,
)
IN_FLIGHT = Gauge(
    "asynctier_in_flight_items",
    "Items taken but not yet resolved, by component and binding.",
    ["component", "binding"],
)
PARKED_KEYS = Gauge(
    "asynctier_parked_keys",
    "Keys of a --ordering key binding waiting behind a record on the delay path.",
    ["binding"],
)
PARKED_OLDEST_SECONDS = Gauge(
    "asynctier_parked_oldest_seconds",
    "How long the oldest parked key of a --ordering key binding has been parked.",
    ["binding"],
)
QUEUE_DEPTH = Gauge(
    "asynctier_scheduler_queue_depth",
    "Items queued in the scheduler, by priority tier.",
    ["tier"],
)
THROTTLED = Counter(
    "asynctier_throttled_total",
    "Items held back by the binding's rate limit.",
    ["binding"],
)
QUOTA_DELAYED = Counter(
    "asynctier_quota_delayed_total",
    "Items delayed because the tenant's quota was used up.",
    ["binding", "tenant"],
)
CONCURRENCY_WAITS = Counter(
    "asynctier_concurrency_waits_total",
    "Items that waited for a concurrency lease of the binding.",
    ["binding"],
)
REDIS_FALLBACK = Counter(
    "asynctier_redis_fallback_total",
    "Admission decisions taken without Redis (by the binding's redis policy).",
    ["binding"],
)
RETRIES = Counter(
    "asynctier_retries_total",
    "Items sent to a delay step, by binding and ladder step (the step's interval).",
    ["binding", "step"],
)
DEAD_LETTERS = Counter(
    "asynctier_dead_letters_total",
    "Items written to the binding's dead-letter topic, by reason.",
    ["binding", "reason"],
)
EXPIRED = Counter(
    "asynctier_expired_total",
    "Items not run because they passed their binding's --expire-after (dead letters).",
    ["binding"],
)
BREAKER_STATE = Gauge(
    "asynctier_breaker_state",
    "A binding's circuit breaker as its scheduler last saw it: 0 closed, 1 ramp, 2 open.",
    ["binding"],
)
BREAKER_PARKED = Counter(
    "asynctier_breaker_parked_total",
    "Items parked (retried later, no attempt spent) because their binding's breaker held "
    "them back.",
    ["binding"],
)
BREAKER_PROBES = Counter(
    "asynctier_breaker_probes_total",
    "Probe items let through an open breaker.",
    ["binding"],
)
DEFERRED = Counter(
    "asynctier_deferred_total",
    "Items of a --defer-when-busy binding parked (retried later, no attempt spent) while "
    "their scheduler was saturated by other work.",
    ["binding"],
)
IN_PROCESSES = Gauge(
    "asynctier_binding_in_processes",
    "1 for a sync binding bound --isolation thread that this scheduler measured CPU-bound "
    "and now runs in worker processes.",
    ["binding"],
)
SATURATED = Gauge(
    "asynctier_scheduler_saturated",
    "1 while this scheduler's workers are saturated by work that does not defer (it then "
    "parks the records of --defer-when-busy bindings), else 0.",
)
CONSUMER_LAG = Gauge(
    "asynctier_consumer_lag",
    "Records not yet committed by the group: end offset minus committed offset.",
    ["group", "topic", "partition"],
)
CONSUMER_LAG_SECONDS = Gauge(
    "asynctier_consumer_lag_seconds",
    "Age of the oldest record the group has not resolved (0 when caught up).",
    ["group", "topic", "partition"],
)
DELAY_BACKLOG = Gauge(
    "asynctier_delay_backlog",
    "Records waiting in a delay topic (sum of its partitions' lag).",
    ["topic"],
)
LIVE_SCHEDULERS = Gauge(
    "asynctier_live_schedulers",
    "Schedulers currently registered as live.",
)
BATCHES = Counter(
    "asynctier_batches_total",
    "Batches handled, by component and binding.",
    ["component", "binding"],
)
RUN_ONCE = Counter(
    "asynctier_run_once_total",
    "The run-once guard's records: fresh (never sent before: run at once, in a running "
    "range instead of a claim), and those claimed: skipped (it had succeeded), waited (a "
    "copy was running), taken_over (its scheduler had died) or done_elsewhere (it failed "
    "here after another scheduler had taken it over and run it to success: answered ok).",
    ["binding", "outcome"],
)
HANDOFF_FAILURES = Counter(
    "asynctier_handoff_failures_total",
    "Failed hand-offs to a delay or dead-letter topic (delivery not confirmed).",
    ["topic"],
)
QUEUE_ITEMS = Gauge(
    "asynctier_queue_items",
    "Items of a queue binding's topic by state: ready, delayed, leased, dead, waiting (for "
    "their parents).",
    ["binding", "tenant", "state"],
)
QUEUE_OLDEST_READY = Gauge(
    "asynctier_queue_oldest_ready_seconds",
    "How long the oldest ready item of a queue binding's topic has waited (0: none ready).",
    ["binding", "tenant"],
)
QUEUE_LEASE_EXPIRIES = Counter(
    "asynctier_queue_lease_expiries_total",
    "Queue items leased again because their previous lease ran out unresolved.",
    ["binding", "tenant"],
)
LONGEST_RUN = Gauge(
    "asynctier_queue_longest_run_seconds",
    "How long the longest-running item of a queue binding has run in its tailer (0: none).",
    ["binding", "tenant"],
)
CHECKPOINTS = Counter(
    "asynctier_checkpoints_total",
    "Checkpoints functions saved (ctx.checkpoint), by outcome: saved, or refused (the lease "
    "was lost or the queue could not store it).",
    ["binding", "outcome"],
)
REGION_CALLS = Counter(
    "asynctier_region_calls_total",
    "Calls a tailer sent to schedulers, by the region they went to and why: home (its own "
    "region), spill (its region was full) or no_home (its region had no live scheduler); "
    "cross-region calls are those not home.",
    ["region", "reason"],
)
LEASES_LOST = Counter(
    "asynctier_queue_leases_lost_total",
    "Items that lost their lease while running, by reason: no_heartbeat (its scheduler stopped "
    "reporting it), stream_broke (its scheduler went away), not_held (leased elsewhere).",
    ["binding", "reason"],
)
TAILER_RESTARTS = Counter(
    "asynctier_tailer_restarts_total",
    "Tailers restarted after they failed (binding: the binding, delay:<interval> for a "
    "delay tailer, <binding>:parked or <binding>:queue for a binding's second loop; "
    "reason: the exception's class, or returned).",
    ["binding", "reason"],
)
TASK_RESTARTS = Counter(
    "asynctier_task_restarts_total",
    "Background loops of a process (registry and tenant followers, membership heartbeat) "
    "restarted after they failed (reason: the exception's class, or returned).",
    ["task", "reason"],
)

#: Every metric above, by the name it is exported under (counters without ``_total``
#: in prometheus-client's ``_name``; the keys here are the exported family names).
SCHEDULE_FIRINGS = Counter(
    "asynctier_schedule_firings_total",
    "Schedule ticks handled by this process: fired (an item enqueued) or skipped (missed "
    "while the platform was down, left out by the schedule's --catch-up).",
    ["outcome"],
)
SCHEDULE_LATENESS = Histogram(
    "asynctier_schedule_lateness_seconds",
    "How late a schedule tick fired: the database's time at its firing minus its tick.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0),
)
SCHEDULE_CLOCK_OFFSET = Gauge(
    "asynctier_schedule_clock_offset_seconds",
    "This process's clock minus the database's, as the schedule loop last saw it (the "
    "loop fires by the database's clock; a large offset is worth fixing all the same).",
)

ALL_METRICS: Final = {
    "asynctier_items_total": ITEMS,
    "asynctier_function_duration_seconds": FUNCTION_DURATION,
    "asynctier_record_to_start_seconds": RECORD_TO_START,
    "asynctier_in_flight_items": IN_FLIGHT,
    "asynctier_parked_keys": PARKED_KEYS,
    "asynctier_parked_oldest_seconds": PARKED_OLDEST_SECONDS,
    "asynctier_scheduler_queue_depth": QUEUE_DEPTH,
    "asynctier_throttled_total": THROTTLED,
    "asynctier_quota_delayed_total": QUOTA_DELAYED,
    "asynctier_concurrency_waits_total": CONCURRENCY_WAITS,
    "asynctier_redis_fallback_total": REDIS_FALLBACK,
    "asynctier_retries_total": RETRIES,
    "asynctier_dead_letters_total": DEAD_LETTERS,
    "asynctier_expired_total": EXPIRED,
    "asynctier_breaker_state": BREAKER_STATE,
    "asynctier_breaker_parked_total": BREAKER_PARKED,
    "asynctier_breaker_probes_total": BREAKER_PROBES,
    "asynctier_deferred_total": DEFERRED,
    "asynctier_scheduler_saturated": SATURATED,
    "asynctier_consumer_lag": CONSUMER_LAG,
    "asynctier_consumer_lag_seconds": CONSUMER_LAG_SECONDS,
    "asynctier_delay_backlog": DELAY_BACKLOG,
    "asynctier_live_schedulers": LIVE_SCHEDULERS,
    "asynctier_batches_total": BATCHES,
    "asynctier_handoff_failures_total": HANDOFF_FAILURES,
    "asynctier_run_once_total": RUN_ONCE,
    "asynctier_queue_items": QUEUE_ITEMS,
    "asynctier_queue_oldest_ready_seconds": QUEUE_OLDEST_READY,
    "asynctier_queue_lease_expiries_total": QUEUE_LEASE_EXPIRIES,
    "asynctier_queue_longest_run_seconds": LONGEST_RUN,
    "asynctier_checkpoints_total": CHECKPOINTS,
    "asynctier_queue_leases_lost_total": LEASES_LOST,
    "asynctier_region_calls_total": REGION_CALLS,
    "asynctier_tailer_restarts_total": TAILER_RESTARTS,
    "asynctier_task_restarts_total": TASK_RESTARTS,
    "asynctier_schedule_firings_total": SCHEDULE_FIRINGS,
    "asynctier_schedule_lateness_seconds": SCHEDULE_LATENESS,
    "asynctier_schedule_clock_offset_seconds": SCHEDULE_CLOCK_OFFSET,
}


def exported_series_names() -> frozenset[str]:
    """Every series name a scrape can show for these metrics (``_bucket``, ``_sum``...)."""
    names: set[str] = set()
    for name, metric in ALL_METRICS.items():
        if isinstance(metric, Histogram):
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count", "_created"))
        elif isinstance(metric, Counter):
            names.update((name, name.removesuffix("_total") + "_created"))
        else:
            names.add(name)
    return frozenset(names)


# --- hot-path helpers: one call per batch and label set ---------------------------------


#: The labelled children of the metrics whose series are never removed, by label values:
#: ``labels()`` takes a lock and builds a tuple each time, several times a chunk.
_CHILDREN: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, kept (only for metrics none of whose series goes)."""
    key = (metric, *labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*labels)
    return child


def record_outcomes(binding: str, tenant: str, counts: Mapping[str, int]) -> None:
    """Count a batch's resolved items: ``counts`` maps outcome -> number of items."""
    for outcome, n in counts.items():
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {sorted(OUTCOMES)}")
        if n:
            _child(ITEMS, binding, tenant, outcome).inc(n)


#: The prometheus_client version whose histogram layout :func:`_layout` was checked against
#: (``tests/platform/test_metrics.py`` fails when an installed version lays it out otherwise).
HISTOGRAM_LAYOUT_CHECKED = "0.26.0"


def _layout(child: Any) -> tuple[Any, Any, Any] | None:
    """A histogram child's upper bounds, per-bucket counters and sum, as prometheus_client
    lays them out (per-bucket counts, cumulated at collection); None if it does not.

    The one place that reads the library's private attributes: observing a chunk with one
    increment per bucket, not one call per value, is what keeps the metrics off the
    scheduler's hot path (``python bench/ab.py BEFORE --work noop``)."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        return None
    return bounds, buckets, total


def _observe_many(child: Any, values: list[float], repeat: int = 1) -> None:
    """Observe many values with one increment per bucket touched (not one per value);
    plain ``observe`` calls where the child is not laid out as :func:`_layout` expects."""
    layout = _layout(child)
    if layout is None:
        for value in values:
            for _ in range(repeat):
                child.observe(value)
        return
    bounds, buckets, total = layout
    counts = collections.Counter(bisect.bisect_left(bounds, value) for value in values)
    for index, n in counts.items():
        buckets[index].inc(n * repeat)
    total.inc(sum(values) * repeat)


def observe_durations(binding: str, seconds: Iterable[float], repeat: int = 1) -> None:
    """Record the function run times of a batch's items (each value ``repeat`` times)."""
    _observe_many(_child(FUNCTION_DURATION, binding), list(seconds), repeat)


def observe_record_to_start(binding: str, seconds: Iterable[float]) -> None:
    """Record, for a batch, the time from each record's timestamp to its function's start."""
    _observe_many(_child(RECORD_TO_START, binding), [max(0.0, s) for s in seconds])


def observe_record_ages(binding: str, record_ms: Sequence[int], start_s: float) -> None:
    """Like :func:`observe_record_to_start`, from record timestamps (epoch ms) and one
    start time (epoch s) shared by the batch. The records of a chunk were mostly written
    within a few ms of each other: when its oldest and newest fall in one bucket, so do
    all the others, and the chunk costs three builtins over its timestamps, not a bucket
    search per record."""
    if not record_ms:
        return
    child = _child(RECORD_TO_START, binding)
    layout = _layout(child)
    youngest = start_s - max(record_ms) / 1000.0
    if layout is not None and youngest > 0.0:
        bounds, buckets, total = layout
        index = bisect.bisect_left(bounds, youngest)
        if index == bisect.bisect_left(bounds, start_s - min(record_ms) / 1000.0):
            buckets[index].inc(len(record_ms))
            total.inc(start_s * len(record_ms) - sum(record_ms) / 1000.0)
            return
    _observe_many(child, [max(0.0, start_s - ms / 1000.0) for ms in record_ms])


def set_in_flight(component: str, binding: str, n: int) -> None:
    """Set how many items ``component`` holds unresolved for ``binding``."""
    IN_FLIGHT.labels(component, binding).set(n)


def set_parked(binding: str, keys: int, oldest_s: float) -> None:
    """Set a --ordering key binding's parked keys and the oldest one's age."""
    PARKED_KEYS.labels(binding).set(keys)
    PARKED_OLDEST_SECONDS.labels(binding).set(oldest_s)


def add_in_flight(component: str, binding: str, delta: int) -> None:
    """Move the in-flight gauge by ``delta`` (negative when items resolve)."""
    IN_FLIGHT.labels(component, binding).inc(delta)


def set_queue_depths(depths: Mapping[str, int]) -> None:
    """Set the scheduler queue depth of each tier (``urgent``, ``normal``, ``batch``)."""
    for tier, n in depths.items():
        _child(QUEUE_DEPTH, tier).set(n)


SUBMITTED = Counter(
    "asynctier_submitter_workloads_total",
    "Workloads answered by the Submitter, by binding, tenant and outcome (accepted, "
    "duplicate, invalid, throttled).",
    ["binding", "tenant", "outcome"],
)
SUBMITTER_REFUSED_CALLS = Counter(
    "asynctier_submitter_refused_calls_total",
    "Submitter calls refused whole, by binding and reason: the gRPC status (NOT_FOUND, "
    "INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE).",
    ["binding", "reason"],
)
SUBMITTER_CALL_SECONDS = Histogram(
    "asynctier_submitter_call_seconds",
    "Time the Submitter took to answer a call (validation, limits and the durable write).",
    ["binding"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

ALL_METRICS.update({
    "asynctier_submitter_workloads_total": SUBMITTED,
    "asynctier_submitter_refused_calls_total": SUBMITTER_REFUSED_CALLS,
    "asynctier_submitter_call_seconds": SUBMITTER_CALL_SECONDS,
})


def count_submitted(binding: str, tenant: str, statuses: Iterable[str]) -> None:
    """Count a call's workloads by status."""
    for status, n in collections.Counter(statuses).items():
        SUBMITTED.labels(binding, tenant, status).inc(n)


def count_submitter_refused_call(binding: str, code: str) -> None:
    """Count one call refused whole with ``code``."""
    SUBMITTER_REFUSED_CALLS.labels(binding, code).inc()


def observe_submitter_call(binding: str, seconds: float) -> None:
    """Observe one answered call's duration."""
    SUBMITTER_CALL_SECONDS.labels(binding).observe(seconds)


def count_throttled(binding: str, n: int = 1) -> None:
    """Count ``n`` items held back by the rate limit."""
    if n:
        THROTTLED.labels(binding).inc(n)


def count_quota_delayed(binding: str, tenant: str, n: int = 1) -> None:
    """Count ``n`` items delayed by the tenant's quota."""
    if n:
        QUOTA_DELAYED.labels(binding, tenant).inc(n)


def count_concurrency_waits(binding: str, n: int = 1) -> None:
    """Count ``n`` items that waited for a concurrency lease."""
    if n:
        CONCURRENCY_WAITS.labels(binding).inc(n)


def count_redis_fallback(binding: str, n: int = 1) -> None:
    """Count ``n`` admission decisions taken without Redis."""
    if n:
        REDIS_FALLBACK.labels(binding).inc(n)


def record_retries(binding: str, steps: Mapping[str | int, int]) -> None:
    """Count retries of a batch: ``steps`` maps ladder step (interval such as ``30s``,
    or step index) -> number of items sent to it."""
    for step, n in steps.items():
        if n:
            RETRIES.labels(binding, str(step)).inc(n)


def record_dead_letters(binding: str, reasons: Mapping[str, int]) -> None:
    """Count dead letters of a batch: ``reasons`` maps reason -> number of items."""
    for reason, n in reasons.items():
        if reason not in DEAD_LETTER_REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}; "
                             f"expected one of {sorted(DEAD_LETTER_REASONS)}")
        if n:
            DEAD_LETTERS.labels(binding, reason).inc(n)


def count_expired(binding: str, n: int = 1) -> None:
    """Count ``n`` items of ``binding`` the scheduler answered ``expired`` (never run)."""
    if n:
        EXPIRED.labels(binding).inc(n)


def set_breaker_state(binding: str, value: int) -> None:
    """The state of ``binding``'s breaker (0 closed, 1 ramp, 2 open)."""
    BREAKER_STATE.labels(binding).set(value)


def count_breaker_parked(binding: str, n: int = 1) -> None:
    """Count ``n`` items of ``binding`` parked by its breaker."""
    if n:
        BREAKER_PARKED.labels(binding).inc(n)


def count_deferred(binding: str, n: int = 1) -> None:
    """Count ``n`` items of ``binding`` deferred while their scheduler was saturated."""
    if n:
        DEFERRED.labels(binding).inc(n)


def set_in_processes(binding: str, moved: bool) -> None:
    """Whether ``binding``, measured CPU-bound, runs in worker processes."""
    IN_PROCESSES.labels(binding).set(1 if moved else 0)


def set_saturated(saturated: bool) -> None:
    """Whether this scheduler is saturated by work that does not defer."""
    SATURATED.set(1 if saturated else 0)


def count_breaker_probes(binding: str, n: int = 1) -> None:
    """Count ``n`` probe items let through ``binding``'s open breaker."""
    if n:
        BREAKER_PROBES.labels(binding).inc(n)


def count_batch(component: str, binding: str, n: int = 1) -> None:
    """Count ``n`` batches handled by ``component`` for ``binding``."""
    BATCHES.labels(component, binding).inc(n)


def count_run_once(binding: str, outcome: str, n: int = 1) -> None:
    """Count records of ``binding`` the run-once guard ran fresh (in a running range, not
    claimed), skipped, made wait or took over, or found done elsewhere after they failed
    here."""
    RUN_ONCE.labels(binding, outcome).inc(n)


def count_handoff_failure(topic: str, n: int = 1) -> None:
    """Count ``n`` hand-offs to ``topic`` whose delivery was not confirmed."""
    HANDOFF_FAILURES.labels(topic).inc(n)


def count_tailer_restart(binding: str, reason: str) -> None:
    """A tailer (or a binding's second loop, or a delay tailer) restarted after a failure."""
    TAILER_RESTARTS.labels(binding, reason).inc()


def count_task_restart(task: str, reason: str) -> None:
    """A background loop of the process restarted after a failure."""
    TASK_RESTARTS.labels(task, reason).inc()


def set_live_schedulers(n: int) -> None:
    """Set how many schedulers are live."""
    LIVE_SCHEDULERS.set(n)


#: The ``reason`` label of :data:`REGION_CALLS` (as :data:`asynctier.platform.placement.REASONS`).
REGION_REASONS: Final = frozenset({"home", "spill", "no_home"})
_region_children: dict[tuple[str, str], Any] = {}


def count_region_call(region: str, reason: str) -> None:
    """One call placed in ``region`` for ``reason`` (home, spill, no_home)."""
    child = _region_children.get((region, reason))
    if child is None:
        if reason not in REGION_REASONS:
            raise ValueError(f"unknown placement reason {reason!r}")
        child = _region_children[(region, reason)] = REGION_CALLS.labels(region, reason)
    child.inc()


def set_delay_backlog(topic: str, n: int) -> None:
    """Set how many records wait in delay topic ``topic``."""
    DELAY_BACKLOG.labels(topic).set(n)


def set_consumer_lag(group: str, topic: str, partition: int, lag: int,
                     lag_seconds: float) -> None:
    """Set one partition's lag in records and in seconds."""
    labels = (group, topic, str(partition))
    CONSUMER_LAG.labels(*labels).set(lag)
    CONSUMER_LAG_SECONDS.labels(*labels).set(lag_seconds)


def forget_consumer_lag(group: str, topic: str, partition: int) -> None:
    """Drop one partition's lag series (its binding was removed)."""
    labels = (group, topic, str(partition))
    for gauge in (CONSUMER_LAG, CONSUMER_LAG_SECONDS):
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)


#: The ``state`` label of :data:`QUEUE_ITEMS`.
QUEUE_STATES: Final = ("ready", "delayed", "leased", "dead", "waiting")


def set_queue_items(binding: str, tenant: str, states: Mapping[str, int],
                    oldest_ready_s: float) -> None:
    """Set a queue binding's items by state and the age of its oldest ready item (a
    binding reads one topic: the binding names it)."""
    for state in QUEUE_STATES:
        QUEUE_ITEMS.labels(binding, tenant, state).set(states.get(state, 0))
    QUEUE_OLDEST_READY.labels(binding, tenant).set(oldest_ready_s)


def forget_queue_items(binding: str, tenant: str) -> None:
    """Drop a queue binding's depth series (it was removed, or its shard is down)."""
    for state in QUEUE_STATES:
        with contextlib.suppress(KeyError):
            QUEUE_ITEMS.remove(binding, tenant, state)
    with contextlib.suppress(KeyError):
        QUEUE_OLDEST_READY.remove(binding, tenant)


def count_lease_expiries(binding: str, tenant: str, n: int) -> None:
    """Count ``n`` items of ``binding`` leased again after their lease ran out."""
    if n:
        QUEUE_LEASE_EXPIRIES.labels(binding, tenant).inc(n)



def set_longest_run(binding: str, tenant: str, seconds: float) -> None:
    """How long the longest item of a queue binding running in this tailer has run."""
    LONGEST_RUN.labels(binding, tenant).set(seconds)


def count_checkpoint(binding: str, result: str) -> None:
    """Count one checkpoint of ``binding``: ``saved`` or ``refused``."""
    CHECKPOINTS.labels(binding, result).inc()


def count_leases_lost(binding: str, why: str, n: int) -> None:
    """Count ``n`` items of ``binding`` that lost their lease while running, for ``why``."""
    if n:
        LEASES_LOST.labels(binding, why).inc(n)


# --- the endpoint -----------------------------------------------------------------------


#: How a call past its timeout was handled (the ``outcome`` label of :data:`TIMEOUTS`).
TIMEOUT_HANDLING: Final = frozenset({"cancelled", "stopped", "left_running"})
TIMEOUTS = Counter(
    "asynctier_function_timeouts_total",
    "Calls past their binding's timeout, by how they were handled: cancelled (async), "
    "stopped (worker process killed) or left_running (a worker thread cannot be stopped).",
    ["binding", "outcome"],
)
OVERRUNNING = Gauge(
    "asynctier_overrunning_calls",
    "Sync calls past their timeout still running in a worker thread (each holds its "
    "thread and, for a capped binding, its concurrency slot until it returns).",
    ["binding"],
)


def count_timeout(binding: str, handling: str) -> None:
    """One call past its timeout, handled as ``handling``."""
    if handling not in TIMEOUT_HANDLING:
        raise ValueError(f"unknown timeout handling {handling!r}")
    TIMEOUTS.labels(binding, handling).inc()


def add_overrunning(binding: str, delta: int) -> None:
    """A sync call of ``binding`` went past its timeout (+1) or finally returned (-1)."""
    OVERRUNNING.labels(binding).inc(delta)


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Serve every metric on ``http://addr:port/metrics`` from a daemon thread.

    ``port`` 0 picks a free port. Returns the port actually bound, and logs it.
    """
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    real = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", addr, real)
    return real
