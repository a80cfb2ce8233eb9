"""Fixtures of the fault scenarios: record count (CI or ``--long``) and the results table.

Every scenario appends its :class:`~tests.faults.checker.Report` to ``fault_results``; at the
end of the session the table in ``tests/faults/README.md`` (between the markers) is
rewritten with the rows of this run (rows of scenarios that did not run are kept).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.checker import Report

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADER = ("| scenario | records | lost | duplicates (allowed) | early | dead letters | verdict |\n"
          "|---|---:|---:|---:|---:|---|---|\n")
_ROW = re.compile(r"^\| (?P<name>[^|]+?) \|")


@pytest.fixture(scope="session")
def records(request: pytest.FixtureRequest) -> int:
    """Records per scenario: 20,000 in CI, 100,000 with ``--long``."""
    return 100_000 if request.config.getoption("--long") else 20_000


@pytest.fixture(scope="session")
def fault_results(request: pytest.FixtureRequest) -> Iterator[list[Report]]:
    """Reports of this session's scenarios; written to the README at the end."""
    results: list[Report] = []
    yield results
    if results:
        write_table(results, "long" if request.config.getoption("--long") else "CI")


def row(r: Report) -> str:
    """One table row."""
    dead = ", ".join(f"{k} {v}" for k, v in sorted(r.dead_letters.items())) or "-"
    verdict = "pass" if r.ok else "FAIL"
    return (f"| {r.scenario} | {r.produced:,} | {len(r.lost)} | {r.duplicates} "
            f"({r.allowed_duplicates}) | {len(r.early)} | {dead} | {verdict} |\n")


def write_table(results: list[Report], mode: str) -> None:
    """Rewrite the table between the markers of the README."""
    text = README.read_text() if README.exists() else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    old, _, tail = rest.partition(END)
    rows: dict[str, str] = {}
    for line in old.splitlines(keepends=True):
        m = _ROW.match(line)
        if m and not line.startswith("| scenario") and not line.startswith("|---"):
            rows[m["name"]] = line
    for r in results:
        rows[r.scenario] = row(r)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table = (f"\n_Last written {stamp} by a {mode} run (`pytest tests/faults"
             f"{' --long' if mode == 'long' else ''}`)._\n\n" + HEADER + "".join(rows.values()))
    README.write_text(f"{head}{BEGIN}{table}{END}{tail}")
