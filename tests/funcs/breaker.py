"""A function whose downstream is down until a given time (the breaker tests bind it).

``ASYNCTIER_TEST_OUTAGE`` names a file holding the epoch second the outage ends (no file:
no outage). Each call appends ``id attempt epoch_s ok|fail`` to ``ASYNCTIER_TEST_LEDGER``.
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


def _outage_until() -> float:
    try:
        return float(Path(os.environ["ASYNCTIER_TEST_OUTAGE"]).read_text())
    except (KeyError, OSError, ValueError):
        return 0.0


def flaky(payload: Any, ctx: Context) -> None:
    """Fail while the outage lasts, succeed after; write the call down either way."""
    now = time.time()
    down = now < _outage_until()
    with _lock, open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
        fh.write(f"{payload['id']} {ctx.attempt} {now:.6f} {'fail' if down else 'ok'}\n")
    if down:
        raise ConnectionError("the downstream is down (test outage)")


@dataclass(frozen=True)
class Call:
    """One call of :func:`flaky`."""

    id: int
    attempt: int
    at: float
    ok: bool


def calls(path: Path) -> list[Call]:
    """Every call written down so far."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 4:
            out.append(Call(int(parts[0]), int(parts[1]), float(parts[2]), parts[3] == "ok"))
    return out
