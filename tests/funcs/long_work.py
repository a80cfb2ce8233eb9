"""Functions of the long-work and timeout tests; each call is appended to a ledger.

The ledger (``$ASYNCTIER_TEST_LEDGER``) gets ``id attempt epoch_s S|D pid source key`` when
a call starts (S) and when it returns (D). A record's JSON drives what the call does:
``sleep`` seconds (``sleep_first``: on attempt 1 only), ``always_fail``, ``until_fixed``
(fails until the file ``<ledger>.fixed`` exists).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from asynctier import Context


def _write(kind: str, payload: Any, ctx: Context) -> None:
    key = ctx.key.decode() if ctx.key else "-"
    line = (f"{payload['id']} {ctx.attempt} {time.time():.6f} {kind} {os.getpid()} "
            f"{ctx.source} {key}\n")
    fd = os.open(os.environ["ASYNCTIER_TEST_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())  # one write per line: O_APPEND keeps lines whole
    finally:
        os.close(fd)


def _fails(payload: Any) -> bool:
    fixed = os.path.exists(os.environ["ASYNCTIER_TEST_LEDGER"] + ".fixed")
    return bool(payload.get("always_fail") or (payload.get("until_fixed") and not fixed))


def _sleep_s(payload: Any, ctx: Context) -> float:
    if payload.get("sleep_first") and ctx.attempt == 1:
        return float(payload["sleep_first"])
    return float(payload.get("sleep", 0))


def work(payload: Any, ctx: Context) -> None:
    """A sync call: sleeps, then fails or returns as the payload says."""
    _write("S", payload, ctx)
    time.sleep(_sleep_s(payload, ctx))
    if _fails(payload):
        raise RuntimeError(f"record {payload['id']} fails")
    _write("D", payload, ctx)


async def async_work(payload: Any, ctx: Context) -> None:
    """An async call: sleeps on the loop, then fails or returns as the payload says."""
    _write("S", payload, ctx)
    await asyncio.sleep(_sleep_s(payload, ctx))
    if _fails(payload):
        raise RuntimeError(f"record {payload['id']} fails")
    _write("D", payload, ctx)


def checkpointing(payload: Any, ctx: Context) -> None:
    """Saves two checkpoints after the one it resumed from (``{"step": n}``), and fails
    when a save is refused: shows ctx.checkpoint and ctx.resumed in a worker process."""
    start = (ctx.resumed or {"step": 0})["step"]
    for step in (start + 1, start + 2):
        ctx.checkpoint({"step": step})
    _write("D", payload, ctx)
