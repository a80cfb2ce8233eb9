"""A test function that writes down where it ran: ``id region epoch_s`` lines, after its work.

The scheduler runs it (``tests.funcs.region:where``) and appends to the file named by
``ASYNCTIER_TEST_LEDGER``; the region is the scheduler's ``ASYNCTIER_REGION``. A record
``{"id": 7, "sleep": 0.1}`` works 0.1 s first: a line means the item finished.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynctier import Context


def where(payload: Any, ctx: Context) -> None:
    """Work ``payload["sleep"]`` seconds, then write ``id region time`` to the ledger."""
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    line = f"{payload['id']} {os.environ.get('ASYNCTIER_REGION', 'local')} {time.time():.6f}\n"
    with open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
        fh.write(line)


@dataclass(frozen=True)
class Ran:
    """One ledger line: which item finished, in which region, when."""

    id: int
    region: str
    at: float


def read(path: Path) -> list[Ran]:
    """Every finished item in the ledger, in file order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            out.append(Ran(int(parts[0]), parts[1], float(parts[2])))
    return out
