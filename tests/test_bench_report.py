"""The benchmark report's latency rounds: which run stands for each reader, and what the
report shows (pure logic: no services)."""

from __future__ import annotations

from bench.report import Results, final_line, render
from bench.scenarios import Latency
from bench.stack import Machine


def _run(p99: float) -> Latency:
    # 100 samples: 98 at 10 ms, then p99 and a slower max, so the 99th is p99
    return Latency(20_000.0, 15.0, 300_000, [10.0] * 98 + [p99, p99 + 50], None, [1.0] * 100)


def _results(rounds: list[dict[str, float]]) -> Results:
    results = Results(Machine("cpu", 2, 24.0, "3.11", "today"), "python bench/run.py", {})
    results.latency_rounds = [{k: _run(v) for k, v in r.items()} for r in rounds]
    results.keep_median_latency()
    return results


def test_each_reader_is_its_round_of_the_median_p99() -> None:
    results = _results([{"raw": 30.0, "guard": 150.0, "idempotent": 22.0},
                        {"raw": 24.0, "guard": 31.0, "idempotent": 40.0},
                        {"raw": 27.0, "guard": 55.0, "idempotent": 21.0}])
    assert results.headline()["p99_ms"] == 55.0
    assert results.headline()["raw_p99_ms"] == 27.0
    assert results.headline()["p99_ms_idempotent"] == 22.0
    assert "p99_ms=55" in final_line(results)


def test_an_even_number_of_rounds_takes_the_lower_middle_and_skips_empty_runs() -> None:
    results = _results([{"guard": 90.0}, {"guard": 40.0}, {"guard": 60.0}, {"guard": 20.0}])
    assert results.headline()["p99_ms"] == 40.0
    results.latency_rounds.append({"guard": Latency(1.0, 1.0, 0, [], None, [])})
    results.keep_median_latency()
    assert results.headline()["p99_ms"] == 40.0


def test_the_report_shows_every_round() -> None:
    text = render(_results([{"raw": 30.0, "guard": 150.0, "idempotent": 22.0},
                            {"raw": 24.0, "guard": 31.0, "idempotent": 40.0}]))
    assert "| 1 | 10.0 | 30.0 | 10.0 | 150.0 | 10.0 | 22.0 |" in text
    assert "| 2 | 10.0 | 24.0 | 10.0 | 31.0 | 10.0 | 40.0 |" in text
    assert "in each of 2 round(s)" in text
