"""The fault table goes to a file of the run, rows merged by scenario; no tracked file is
written."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.faults.checker import Report
from tests.faults.conftest import write_table

README = Path(__file__).with_name("README.md")


def _report(name: str, lost: list[int]) -> Report:
    return Report(scenario=name, produced=10, succeeded=10 - len(lost), dead_letters={},
                  pending=0, lost=lost, duplicates=0, early=[], allowed_duplicates=0)


def test_rows_merge_by_scenario_in_the_run_file_and_the_readme_is_untouched(
        tmp_path: Path) -> None:
    before = hashlib.sha256(README.read_bytes()).hexdigest()
    table = tmp_path / "faults.md"
    write_table([_report("a", []), _report("b", [3])], "CI", table)
    write_table([_report("b", [])], "CI", table)
    rows = [line for line in table.read_text().splitlines() if line.startswith("| a |")
            or line.startswith("| b |")]
    assert rows == ["| a | 10 | 0 | 0 (0) | 0 | - | pass |",
                    "| b | 10 | 0 | 0 (0) | 0 | - | pass |"]
    assert hashlib.sha256(README.read_bytes()).hexdigest() == before
