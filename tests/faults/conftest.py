"""Fixtures of the fault scenarios: record count (CI or ``--long``) and the results table.

Every scenario appends its :class:`~tests.faults.checker.Report` to ``fault_results``; at the
end of the session the rows of this run are merged into a table in a file of the test run,
``.asynctier/fault-results.md`` (or ``$ASYNCTIER_FAULT_TABLE``), never into a tracked file:
copy it into ``tests/faults/README.md`` by hand after a ``--long`` run worth keeping.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.checker import Report

ROOT = Path(__file__).resolve().parent.parent.parent
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
    """Reports of this session's scenarios; written to :func:`table_path` at the end."""
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


def table_path() -> Path:
    """Where this run's table goes: ``$ASYNCTIER_FAULT_TABLE``, else a file of the run."""
    return Path(os.environ.get("ASYNCTIER_FAULT_TABLE")
                or ROOT / ".asynctier" / "fault-results.md")


def write_table(results: list[Report], mode: str, path: Path | None = None) -> None:
    """Merge ``results`` into the table of ``path`` (rows of scenarios that did not run in
    this session are kept; pytest-xdist workers take turns under a file lock)."""
    path = path or table_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(results, mode, path)


def _merge(results: list[Report], mode: str, path: Path) -> None:
    text = path.read_text() if path.exists() else f"{BEGIN}\n{END}\n"
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
    path.write_text(f"{head}{BEGIN}{table}{END}{tail}")
