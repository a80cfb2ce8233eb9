"""A ledger outside the platform: test functions append every invocation to a file.

Functions in this module are bound by tests (``tests.funcs.ledger:record`` ...); the scheduler runs
them in its own process and appends ``id attempt epoch_s source`` lines to the file named by
``ASYNCTIER_TEST_LEDGER``. What a function does is driven by the record itself:

- ``{"id": 7}`` succeeds;
- ``{"id": 7, "fail_until": 3}`` raises while ``ctx.attempt < 3``;
- ``{"id": 7, "always_fail": true}`` always raises;
- ``{"id": 7, "retry_after": 7}`` asks for ``Retry(after=7)`` on its first attempt;
- ``{"id": 7, "reject": true}`` raises ``Reject``;
- ``{"id": 7, "sleep": 0.5}`` sleeps first.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynctier import Context, Reject, Retry

_fd: int | None = None
_lock = threading.Lock()


def _write(line: str) -> None:
    global _fd
    if _fd is None:
        with _lock:
            if _fd is None:
                _fd = os.open(os.environ["ASYNCTIER_TEST_LEDGER"],
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())


def record(payload: Any, ctx: Context) -> None:
    """Append the invocation to the ledger, then behave as the payload says."""
    _write(f"{payload['id']} {ctx.attempt} {time.time():.6f} {ctx.source}\n")
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("reject"):
        raise Reject(f"record {payload['id']} rejected by request")
    if payload.get("always_fail"):
        raise RuntimeError(f"record {payload['id']} always fails")
    if ctx.attempt < int(payload.get("fail_until", 0)):
        raise RuntimeError(f"record {payload['id']} fails on attempt {ctx.attempt}")
    if payload.get("retry_after") and ctx.attempt == 1:
        raise Retry(after=float(payload["retry_after"]))


async def record_async(payload: Any, ctx: Context) -> None:
    """The same as :func:`record`, as a coroutine."""
    record(payload, ctx)


@dataclass(frozen=True)
class Call:
    """One ledger line."""

    id: int
    attempt: int
    at: float
    source: str


def read(path: Path) -> list[Call]:
    """Every call in the ledger, in file order."""
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 4:
            calls.append(Call(int(parts[0]), int(parts[1]), float(parts[2]), parts[3]))
    return calls


def ids_seen(path: Path) -> Counter[int]:
    """How many times each id ran."""
    return Counter(call.id for call in read(path))


def span(payload: Any, ctx: Context) -> None:
    """Sleep ``payload["sleep"]`` seconds and append ``id start end pid`` (a ``span`` line)."""
    started = time.time()
    time.sleep(float(payload.get("sleep", 0.05)))
    _write(f"span {payload['id']} {started:.6f} {time.time():.6f} {os.getpid()}\n")


def spans(path: Path) -> list[tuple[int, float, float, int]]:
    """Every ``span`` line: (id, start, end, pid)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "span" and len(parts) == 5:
            out.append((int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4])))
    return out
