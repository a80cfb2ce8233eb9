"""Functions for the run stream's tests (tests/scheduler/test_run_stream.py): what each does is in
its payload."""

from __future__ import annotations

import time
from typing import Any

from asynctier import Context, Reject


def work(payload: Any, ctx: Context) -> None:
    """Sleep ``sleep`` seconds in ``checkpoints + 1`` steps, checkpointing ``{"step": n}``
    between them; ``{"show_resumed": true}`` rejects with ``resumed=<ctx.resumed>``."""
    if payload.get("show_resumed"):
        raise Reject(f"resumed={ctx.resumed!r}")
    steps = int(payload.get("checkpoints", 0))
    for step in range(steps):
        time.sleep(float(payload.get("sleep", 0)) / (steps + 1))
        ctx.checkpoint({"step": step + 1})
    time.sleep(float(payload.get("sleep", 0)) / (steps + 1))


async def awork(payload: Any, ctx: Context) -> None:
    """Checkpoint ``state`` once (awaited), then return."""
    await ctx.acheckpoint(payload["state"])
