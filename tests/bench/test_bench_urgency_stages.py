"""The urgency bench's table of where the probe records' time went (pure logic)."""

from __future__ import annotations

from bench.scenarios import Latency
from bench.urgency import CASES, STAGES, Measured, Row, stage_lines


def measured(stages: list[list[float]] | None) -> Measured:
    return Measured(Latency(30, 10, 3, [1.0, 2.0, 3.0]), stages=stages)


def test_each_step_is_the_records_own_difference_alone_and_loaded() -> None:
    alone = [[1.0, 1.5, 2.5, 3.0], [2.0, 2.5, 3.5, 4.0], [1.0, 1.5, 2.5, 3.0]]
    loaded = [[1.0, 1.5, 2.5, 40.0], [1.0, 1.5, 2.5, 3.0], [1.0, 1.5, 2.5, 30.0]]
    lines = stage_lines([Row(CASES[0], measured(alone), measured(loaded))])
    header = next(line for line in lines if line.startswith("| case"))
    assert all(stage in header for stage in STAGES)
    alone_line, loaded_line = [line for line in lines if line.startswith(f"| {CASES[0].title}")]
    assert "| alone | 1.0 / 2.0 | 0.5 / 0.5 | 1.0 / 1.0 | 0.5 / 0.5 |" in alone_line
    # the worker's step is where the backlog shows: 37.5 and 27.5 ms against 0.5
    assert loaded_line.endswith("| 27.5 / 37.5 |")


def test_no_stages_no_table() -> None:
    assert stage_lines([Row(CASES[0], measured(None), measured(None))]) == []
