"""Functions the deadline tests bind: each call appends one line to ``ASYNCTIER_TEST_LEDGER``.

A line is ``binding id record_time start deadline`` (epoch seconds), so a test can measure
each record's start delay (start - record time) and check ``ctx.deadline``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynctier import Context

_lock = threading.Lock()


def note(payload: Any, ctx: Context) -> None:
    """Write down when this record started, then sleep ``payload["sleep"]`` seconds or keep
    the CPU busy ``payload["burn"]`` seconds."""
    line = (f"{ctx.binding} {payload['id']} {ctx.record_time:.6f} {time.time():.6f} "
            f"{ctx.deadline:.6f}\n")
    with _lock, open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
        fh.write(line)
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    end = time.thread_time() + float(payload.get("burn", 0))
    while time.thread_time() < end:
        pass


@dataclass(frozen=True)
class Start:
    """One ledger line: a record of ``binding`` started at ``start``."""

    binding: str
    id: int
    record_time: float
    start: float
    deadline: float

    @property
    def delay_s(self) -> float:
        """Seconds from its record time to its start."""
        return self.start - self.record_time


def starts(path: Path) -> list[Start]:
    """Every line of the ledger."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 5:
            out.append(Start(parts[0], int(parts[1]), float(parts[2]), float(parts[3]),
                             float(parts[4])))
    return out
