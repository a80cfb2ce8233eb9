"""The checker: what became of every produced id, from the ledger and the topics.

``lost = produced - (succeeded + dead letters + still pending)``; duplicates are successful
runs beyond one per id; a retry is early when attempt ``n + 1`` of an id started before the
first start of attempt ``n`` plus the ladder's wait for attempt ``n`` (the hand-off that set
its due time happened after that start, so this bound can only be generous).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.delay_streams.ladder import ladder_delay


@dataclass(frozen=True)
class Call:
    """One ledger line: a start (``S``) or a success (``D``) of one attempt of one id."""

    id: int
    attempt: int
    at: float
    kind: str
    pid: int


def read_ledger(path: Path) -> list[Call]:
    """Every whole line of the ledger."""
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 6 and parts[3] in ("S", "D"):
            calls.append(Call(int(parts[0]), int(parts[1]), float(parts[2]), parts[3],
                              int(parts[4])))
    return calls


def succeeded(calls: Iterable[Call]) -> Counter[int]:
    """Successful runs per id."""
    return Counter(c.id for c in calls if c.kind == "D")


def early_retries(calls: Iterable[Call], ladder_s: Sequence[float],
                  slack_s: float = 0.002) -> list[tuple[int, int, float]]:
    """(id, attempt, seconds early) of every attempt that started before it was due."""
    first: dict[tuple[int, int], float] = {}
    for c in calls:
        if c.kind == "S":
            key = (c.id, c.attempt)
            first[key] = min(first.get(key, c.at), c.at)
    early = []
    for (ident, attempt), at in first.items():
        before = first.get((ident, attempt - 1))
        if attempt < 2 or before is None:
            continue
        due = before + ladder_delay(attempt - 1, ladder_s)
        if at + slack_s < due:
            early.append((ident, attempt, due - at))
    return early


@dataclass
class Report:
    """The figures of one scenario."""

    scenario: str
    produced: int
    succeeded: int
    dead_letters: dict[str, int]
    pending: int
    lost: list[int]
    duplicates: int
    early: list[tuple[int, int, float]]
    allowed_duplicates: int
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """0 lost, no early retry, duplicates within what the crashes allow."""
        return not self.lost and not self.early and self.duplicates <= self.allowed_duplicates

    def summary(self) -> str:
        """One line for the test output."""
        return (f"{self.scenario}: produced {self.produced}, succeeded {self.succeeded}, "
                f"dead letters {dict(self.dead_letters)}, pending {self.pending}, "
                f"lost {len(self.lost)}, duplicates {self.duplicates} (allowed "
                f"{self.allowed_duplicates}), early {len(self.early)}")


def dead_letter_ids(letters: Iterable[object]) -> dict[int, str]:
    """id -> reason of the dead letters whose value is a JSON record with an id."""
    out: dict[int, str] = {}
    for msg in letters:
        headers = dict(msg.headers() or ())  # type: ignore[attr-defined]
        reason = (headers.get("asynctier.reason") or b"?").decode()
        try:
            doc = json.loads(msg.value())  # type: ignore[attr-defined]
            out[int(doc["id"])] = reason
        except (TypeError, ValueError, KeyError):
            continue
    return out


def check(scenario: str, produced: Iterable[int], calls: list[Call],
          dead: dict[int, str], pending: Iterable[int], ladder_s: Sequence[float],
          allowed_duplicates: int) -> Report:
    """The report of one scenario (see the module docstring)."""
    want = set(produced)
    runs = succeeded(calls)
    pend = set(pending) - set(runs) - set(dead)
    lost = sorted(want - set(runs) - set(dead) - pend)
    reasons: dict[str, int] = defaultdict(int)
    for ident in want & set(dead):
        reasons[dead[ident]] += 1
    dups = sum(n - 1 for ident, n in runs.items() if ident in want and n > 1)
    return Report(scenario, len(want), len(want & set(runs)), dict(reasons), len(pend & want),
                  lost, dups, early_retries(calls, ladder_s), allowed_duplicates)
