"""A function that says which process ran it: each call appends ``binding id pid`` to
``ASYNCTIER_TEST_LEDGER``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from asynctier import Context

_lock = threading.Lock()


def note_pid(payload: Any, ctx: Context) -> None:
    """Write down this record's binding, id and the pid of the process running it."""
    with _lock, open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
        fh.write(f"{ctx.binding} {payload['id']} {os.getpid()}\n")


def ran_in(path: Path) -> list[tuple[str, int, int]]:
    """Every ledger line: (binding, id, pid)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found
