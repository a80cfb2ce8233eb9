"""Test functions: every outcome kind, sync and async, and recorders the tests read."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asynctier import Context, Reject, Retry

SEEN: list[tuple[Any, Context]] = []
#: Set by a test: what :func:`hooked_boom` awaits, on the scheduler's loop, before it raises.
HOOK: Callable[[Any, Context], Awaitable[None]] | None = None
STARTS: dict[str, list[tuple[Any, float]]] = {}
#: What :func:`gauged` and :func:`async_gauged` saw: calls made, running now, most at once.
ACTIVE: dict[str, int] = {"calls": 0, "now": 0, "peak": 0}
_LOCK = threading.Lock()


def reset() -> None:
    """Forget everything recorded."""
    with _LOCK:
        SEEN.clear()
        STARTS.clear()
        ACTIVE.update(calls=0, now=0, peak=0)


def noop(payload: Any, ctx: Context) -> None:
    """Does nothing (throughput)."""


def record(payload: Any, ctx: Context) -> None:
    """Records the payload and its context."""
    with _LOCK:
        SEEN.append((payload, ctx))


async def async_record(payload: Any, ctx: Context) -> None:
    """Records the payload and its context, from the event loop."""
    await asyncio.sleep(0)
    SEEN.append((payload, ctx))


def retry_later(payload: Any, ctx: Context) -> None:
    """Asks to run again in 7 s."""
    raise Retry(after=7, reason="not ready yet")


def reject(payload: Any, ctx: Context) -> None:
    """Fails for good."""
    raise Reject("bad order")


def boom(payload: Any, ctx: Context) -> None:
    """Raises an ordinary exception with a long message."""
    raise ValueError("boom " + "x" * 2000)


async def async_boom(payload: Any, ctx: Context) -> None:
    """Raises from a coroutine."""
    raise KeyError("missing")


async def async_reject(payload: Any, ctx: Context) -> None:
    """Fails for good, from a coroutine."""
    raise Reject("async bad order")


def sleepy(payload: Any, ctx: Context) -> None:
    """Sleeps ``payload["sleep"]`` seconds."""
    time.sleep(payload["sleep"])


def marked_sleepy(payload: Any, ctx: Context) -> None:
    """Creates a file named after its item in the folder ``payload["mark"]`` (so that a
    test in another process sees it started), then sleeps ``payload["sleep"]`` seconds."""
    (Path(payload["mark"]) / f"started-{ctx.source}".replace("/", "-")).touch()
    time.sleep(payload["sleep"])


async def async_sleepy(payload: Any, ctx: Context) -> None:
    """Sleeps ``payload["sleep"]`` seconds on the loop."""
    await asyncio.sleep(payload["sleep"])


def timed(payload: Any, ctx: Context) -> None:
    """Records when it started (per binding) and sleeps ``payload["ms"]`` milliseconds."""
    started = time.monotonic()
    with _LOCK:
        STARTS.setdefault(ctx.binding, []).append((payload.get("n"), started))
    time.sleep(payload.get("ms", 0) / 1000.0)


def _enter() -> None:
    with _LOCK:
        ACTIVE["calls"] += 1
        ACTIVE["now"] += 1
        ACTIVE["peak"] = max(ACTIVE["peak"], ACTIVE["now"])


def _leave() -> None:
    with _LOCK:
        ACTIVE["now"] -= 1


def gauged(payload: Any, ctx: Context) -> None:
    """Counts itself in :data:`ACTIVE` while it sleeps ``payload["ms"]`` milliseconds."""
    _enter()
    try:
        time.sleep(payload.get("ms", 0) / 1000.0)
    finally:
        _leave()


async def async_gauged(payload: Any, ctx: Context) -> None:
    """:func:`gauged` on the event loop."""
    _enter()
    try:
        await asyncio.sleep(payload.get("ms", 0) / 1000.0)
    finally:
        _leave()


async def async_noop(payload: Any, ctx: Context) -> None:
    """Does nothing, from the event loop (throughput)."""


def slow_record(payload: Any, ctx: Context) -> None:
    """Records the payload and its context, sleeps ``payload["sleep"]`` seconds (0 when not
    given) and raises when ``payload["fail"]`` is true."""
    with _LOCK:
        SEEN.append((payload, ctx))
    time.sleep(payload.get("sleep", 0))
    if payload.get("fail"):
        raise RuntimeError("asked to fail")


async def hooked_boom(payload: Any, ctx: Context) -> None:
    """Awaits :data:`HOOK` (when set), then fails."""
    if HOOK is not None:
        await HOOK(payload, ctx)
    raise RuntimeError("failed after the hook")


async def async_stubborn(payload: Any, ctx: Context) -> None:
    """Sleeps ``payload["sleep"]`` seconds on the loop; cancelled, it ignores the cancel and
    returns after ``payload["after"]`` seconds more (as a careless function may)."""
    try:
        await asyncio.sleep(payload["sleep"])
    except asyncio.CancelledError:
        await asyncio.sleep(payload["after"])


def spin(payload: Any, ctx: Context) -> None:
    """Keeps the CPU busy ``payload["cpu_ms"]`` ms of its own CPU time and sleeps
    ``payload["sleep_ms"]``, then appends "id pid niceness" to the file ``payload["out"]``
    (it may run in a worker process)."""
    end = time.thread_time() + payload.get("cpu_ms", 0) / 1000.0
    while time.thread_time() < end:
        pass
    time.sleep(payload.get("sleep_ms", 0) / 1000.0)
    with open(payload["out"], "a") as out:
        out.write(f"{payload['id']} {os.getpid()} {os.nice(0)}\n")
