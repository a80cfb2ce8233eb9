"""The queue drain's report: ratios over rounds, its section of RESULTS.md kept apart from
the rest of the file (pure logic: no services)."""

from __future__ import annotations

from pathlib import Path

from bench.queue_report import END, START, QueueResults, final_line, keep_section, render
from bench.queue_report import write_section as write
from bench.queue_scenarios import Filled
from bench.scenarios import Row
from bench.stack import Machine


def _row(rate: float) -> Row:
    return Row("x", int(rate * 10), 10.0, 1.0, 0.5, {}, "", {"cpu_s.postgres": 0.5})


def _results(rounds: list[dict[str, float]], warmup: dict[str, float] | None = None
             ) -> QueueResults:
    results = QueueResults(Machine("cpu", 2, 24.0, "3.11", "today"), "python q.py", {})
    for counted, rates in ([(False, warmup)] if warmup else []) + [(True, r) for r in rounds]:
        results.start_round(counted, "1.00, 1.00, 1.00")
        for key, rate in rates.items():
            results.add(key, _row(rate), Filled(1000, 0.1, 100) if key == "queue" else None)
    return results


def test_each_ratio_is_the_median_of_the_rounds_ratios_without_the_warm_up() -> None:
    results = _results([{"queue": 10_000, "procrastinate": 100, "kafka": 25_000},
                        {"queue": 12_000, "procrastinate": 400, "kafka": 30_000},
                        {"queue": 9_000, "procrastinate": 300, "kafka": 45_000}],
                       warmup={"queue": 1, "procrastinate": 1, "kafka": 1})
    assert results.ratio("queue", "procrastinate") == 30.0  # 100, 30, 30
    assert results.ratio("queue", "kafka") == 0.4  # 0.4, 0.4, 0.2
    assert results.missed() == []
    line = final_line(results)
    assert "queue_ratio_vs_procrastinate=30.0" in line
    assert "enqueue_per_s=10000" in line


def test_a_missed_goal_is_reported_with_how_far_off_it_is() -> None:
    results = _results([{"queue": 10_000, "procrastinate": 1_000, "kafka": 50_000}])
    assert results.missed() == ["queue_ratio_vs_procrastinate", "queue_ratio_vs_kafka"]
    text = render(results)
    assert "MISSED by 50%" in text  # 10x against 20x
    assert "MISSED by 33%" in text  # 0.2x against 0.3x


def test_the_section_replaces_its_old_self_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\nthe Kafka tables\n")
    write(path, f"{START}\nfirst\n{END}\n")
    write(path, f"{START}\nsecond\n{END}\n")
    text = path.read_text()
    assert text.startswith("# Benchmark results\n\nthe Kafka tables\n")
    assert "second" in text and "first" not in text
    assert text.count(START) == 1


def test_a_rewrite_by_run_py_carries_the_section_over() -> None:
    old = f"# old\n\n{START}\nqueue figures\n{END}\n"
    assert keep_section(old, "# new\n").endswith(f"{START}\nqueue figures\n{END}\n")
    assert keep_section("# old\n", "# new\n") == "# new\n"
    later = f"{old}\n## Submitter\n\nits figures\n"
    assert keep_section(later, "# new\n").endswith(f"{END}\n\n## Submitter\n\nits figures\n")
