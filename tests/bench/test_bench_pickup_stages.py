"""The pickup-by-stage bench's reading of a trace and its figures (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.pickup_stages import STAGES, section, stage_times, steps


def span(name: str, start_s: float, duration_s: float) -> dict[str, Any]:
    return {"operationName": name, "startTime": int(start_s * 1e6),
            "duration": int(duration_s * 1e6)}


def test_the_first_attempts_spans_give_the_stages() -> None:
    trace = {"spans": [
        span("process b", 10.004, 0.010), span("read b", 10.002, 0.001),
        span("run m:f", 10.006, 0.001),
        span("read b", 40.0, 0.001), span("process b", 40.1, 0.01),  # a later attempt
        span("run m:f", 40.2, 0.001), span("charge", 10.0065, 0.0001)]}
    assert stage_times(trace, "b") == pytest.approx([10.002, 10.003, 10.004, 10.006])


def test_a_trace_without_one_of_its_spans_is_not_read_yet() -> None:
    trace = {"spans": [span("read b", 1.0, 0.001), span("process b", 1.002, 0.01)]}
    assert stage_times(trace, "b") is None
    assert stage_times({}, "b") is None


def test_steps_are_each_items_own_differences() -> None:
    rows = [[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 4.0, 5.0, 9.0, 9.5], [2.0, 3.0, 3.5, 4.0, 6.0]]
    # second stage minus first: 1, 3, 1 -> 1; the fourth minus the third: 1, 4, 0.5 -> 1
    assert steps(rows) == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0])
    text = section(rows, 3, 500)
    assert text.startswith("## Queue pickup by stage")
    assert all(label in text for label in STAGES)
    assert "--items 3 --rate 500" in text
