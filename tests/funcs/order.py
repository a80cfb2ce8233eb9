"""Functions the per-key order tests bind (``tests.funcs.order:step`` ...).

A record is ``{"key": "k7", "seq": 3}``, the key's records numbered from 0 in the order
produced; ``fail_until: 3`` fails while ``ctx.attempt < 3``; ``fail_for_s: 60`` with
``t0`` (epoch s) fails until ``t0 + fail_for_s``; ``fail_while: PATH`` fails while that
file exists. Every success appends
``key seq attempt epoch_s source`` to the file named by ``ASYNCTIER_TEST_LEDGER`` before
returning, so the file's order per key is the order of first successes.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynctier import Context

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


def step(payload: Any, ctx: Context) -> None:
    """Fail as the record says, else write the success to the ledger."""
    if ctx.attempt < int(payload.get("fail_until", 0)):
        raise RuntimeError(f"{payload['key']}#{payload['seq']} fails on attempt {ctx.attempt}")
    if payload.get("fail_while") and os.path.exists(payload["fail_while"]):
        raise RuntimeError(f"{payload['key']}#{payload['seq']} fails while "
                           f"{payload['fail_while']} exists")
    if payload.get("fail_for_s") and time.time() < payload["t0"] + payload["fail_for_s"]:
        raise RuntimeError(f"{payload['key']}#{payload['seq']} fails for a while")
    _write(f"{payload['key']} {payload['seq']} {ctx.attempt} {time.time():.6f} {ctx.source}\n")


@dataclass(frozen=True)
class Success:
    """One ledger line."""

    key: str
    seq: int
    attempt: int
    at: float
    source: str = ""


def read(path: Path) -> list[Success]:
    """Every success in the ledger, in file order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 5:
            out.append(Success(parts[0], int(parts[1]), int(parts[2]), float(parts[3]),
                               parts[4]))
    return out


def first_successes(path: Path, topic: str = "") -> dict[str, list[int]]:
    """Per key, its seqs in the order of their first success (of ``topic``'s records only,
    when given)."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, list[int]] = {}
    for s in read(path):
        if topic and not s.source.startswith(f"{topic}/"):
            continue
        if (s.key, s.seq) not in seen:
            seen.add((s.key, s.seq))
            out.setdefault(s.key, []).append(s.seq)
    return out


def out_of_order(path: Path, topic: str = "") -> list[tuple[str, list[int]]]:
    """The keys whose first successes are not in sequence order."""
    return [(k, seqs) for k, seqs in first_successes(path, topic).items()
            if seqs != sorted(seqs)]


def out_of_offset_order(path: Path, topic: str = "") -> list[tuple[str, list[str]]]:
    """The keys whose first successes are not in the order of their records' offsets
    (what per-key order promises, whatever order a producer wrote them in)."""
    seen: set[tuple[str, int]] = set()
    runs: dict[str, list[str]] = {}
    for s in read(path):
        if (topic and not s.source.startswith(f"{topic}/")) or (s.key, s.seq) in seen:
            continue
        seen.add((s.key, s.seq))
        runs.setdefault(s.key, []).append(s.source)
    return [(k, sources) for k, sources in runs.items()
            if [int(x.rsplit("/", 1)[1]) for x in sources]
            != sorted(int(x.rsplit("/", 1)[1]) for x in sources)]
