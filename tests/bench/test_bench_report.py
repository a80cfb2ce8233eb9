"""The benchmark report's latency rounds: which run stands for each reader, and what the
report shows (pure logic: no services)."""

from __future__ import annotations

from bench.report import Results, final_line, render
from bench.scenarios import Latency, Row
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


def _row(name: str, rate: float) -> Row:
    return Row(name, int(rate * 10), 10.0, 1.0, None, {})


def _peer_results(rounds: list[dict[str, float]]) -> Results:
    results = Results(Machine("cpu", 2, 24.0, "3.11", "today"), "python bench/run.py", {})
    results.peer_rounds = [{k: _row(k, v) for k, v in r.items()} for r in rounds]
    results.keep_median_peer_rows()
    return results


def test_peer_ratios_are_medians_of_the_rounds_same_round_pairs() -> None:
    results = _peer_results([
        {"asynctier.noop": 100.0, "quix.noop": 50.0, "faust.noop": 10.0,
         "asynctier.sleep": 8000.0, "quix.sleep": 800.0, "faust.sleep": 400.0},
        {"asynctier.noop": 60.0, "quix.noop": 60.0, "faust.noop": 5.0,
         "asynctier.sleep": 4000.0, "quix.sleep": 1000.0, "faust.sleep": 200.0},
        {"asynctier.noop": 90.0, "quix.noop": 30.0, "faust.noop": 9.0,
         "asynctier.sleep": 6000.0, "quix.sleep": 500.0, "faust.sleep": 300.0}])
    head = results.headline()
    # per round 2.0, 1.0, 3.0 -> 2.0 (not 90 / 50, the ratio of the median rows)
    assert head["ratio_vs_quix"] == 2.0
    assert head["ratio_vs_faust"] == 10.0
    assert head["io_ratio_vs_quix"] == 10.0
    assert head["io_ratio_vs_faust"] == 20.0
    assert head["aio_ratio_vs_quix"] is None
    assert results.targets()["io_ratio_vs_best"] == 10.0  # the faster peer: Quix
    assert results.rows["quix.noop"].rate == 50.0  # its round of the median rate
    line = final_line(results)
    for key in ("ratio_vs_quix=2.00", "ratio_vs_faust=10.00", "io_ratio_vs_quix=10.00",
                "io_ratio_vs_faust=20.00", "aio_ratio_vs_quix=nan", "p99_ratio_vs_raw=nan",
                "p99_ratio_vs_raw_idempotent=nan"):
        assert key in line.split()


def test_the_report_shows_every_peer_round_and_the_peer_targets() -> None:
    text = render(_peer_results([{"asynctier.noop": 100.0, "quix.noop": 120.0},
                                 {"asynctier.noop": 110.0, "quix.noop": 100.0}]))
    assert "| round | `asynctier.noop` | `quix.noop` |" in text
    assert "| 1 | 100 | 120 |" in text and "| 2 | 110 | 100 |" in text
    # median of 0.83 and 1.10: the lower middle, 0.83 -> missed
    assert "| asynctier / Quix Streams, no-op (issue 30) | >= 1 | 0.83 | no |" in text


def test_p99_ratios_divide_by_the_raw_loop_of_the_same_round() -> None:
    results = _results([{"raw": 30.0, "guard": 60.0, "idempotent": 33.0},
                        {"raw": 60.0, "guard": 66.0, "idempotent": 60.0},
                        {"raw": 40.0, "guard": 60.0, "idempotent": 40.0}])
    head = results.headline()
    assert head["p99_ratio_vs_raw"] == 1.5  # 2.0, 1.1, 1.5
    assert head["p99_ratio_vs_raw_idempotent"] == 1.0  # 1.1, 1.0, 1.0
    assert "p99_ratio_vs_raw=1.50" in final_line(results)


def test_the_raw_floods_ratio_is_the_median_of_its_rounds_and_shown_per_round() -> None:
    results = Results(Machine("cpu", 2, 24.0, "3.11", "today"), "python bench/run.py", {})
    results.rounds = [{k: _row(k, v) for k, v in r.items()} for r in (
        {"raw": 100.0, "raw_flood": 70.0, "asynctier": 130.0, "flood": 90.0},
        {"raw": 110.0, "raw_flood": 88.0, "asynctier": 140.0, "flood": 84.0},
        {"raw": 90.0, "raw_flood": 54.0, "asynctier": 120.0, "flood": 84.0})]
    results.keep_median_rows()
    head = results.headline()
    assert head["raw_flood_ratio"] == 0.7  # 0.7, 0.8, 0.6
    assert head["ratio_vs_raw"] == 1.3  # 1.3, 1.27, 1.33: a round's pair, not 130 / 100
    assert "raw_flood_ratio=0.70" in final_line(results).split()
    text = render(results)
    assert "| 2 | 110 | 88 | 0.80 | 140 | n/a | 84 | n/a | 0.60 |" in text
    assert "| raw_flood | 700 | 10.00 | 70 | 0.70 |" in text  # its median round, the rounds' ratio
    assert "| cores busy | peak RSS (MB) |" in text
