"""Functions the fault scenarios bind; each call is appended to a ledger outside the platform.

The ledger (``$ASYNCTIER_TEST_LEDGER``) gets ``id attempt epoch_s S pid source`` when a call
starts and ``id attempt epoch_s D pid source`` when it returns without raising (``pid``: the
scheduler process that ran it). A record's JSON
drives what the function does:

- ``{"id": 7}`` succeeds;
- ``{"id": 7, "fail_until": 3}`` raises while ``ctx.attempt < 3``;
- ``{"id": 7, "always_fail": true}`` always raises;
- ``{"id": 7, "exit": true}`` kills its worker process (``os._exit``), every time;
- ``{"id": 7, "sleep": 0.5}`` sleeps first;
- ``{"id": 7, "until_fixed": true}`` raises until the file ``<ledger>.fixed`` exists (a
  bug fixed: ``dlq replay`` or ``queue replay`` then runs it once).
"""

from __future__ import annotations

import os
import threading
import time
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
    os.write(_fd, line.encode())  # one write per line: O_APPEND keeps lines whole


def run(payload: Any, ctx: Context) -> None:
    """Append the start of the call, behave as the payload says, append its success."""
    ident = payload["id"]
    _write(f"{ident} {ctx.attempt} {time.time():.6f} S {os.getpid()} {ctx.source}\n")
    if payload.get("exit"):
        os._exit(17)
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("until_fixed") and not os.path.exists(
            os.environ["ASYNCTIER_TEST_LEDGER"] + ".fixed"):
        raise RuntimeError(f"record {ident} fails until its bug is fixed")
    if payload.get("always_fail"):
        raise RuntimeError(f"record {ident} always fails")
    if ctx.attempt < int(payload.get("fail_until", 0)):
        raise RuntimeError(f"record {ident} fails on attempt {ctx.attempt}")
    _write(f"{ident} {ctx.attempt} {time.time():.6f} D {os.getpid()} {ctx.source}\n")


def long_run(payload: Any, ctx: Context) -> None:
    """Long work with checkpoints: ``{"id": 1, "seconds": 90, "every": 10}`` works
    ``seconds`` in steps of ``every``, saving ``{"done": s}`` after each step, and resumes
    from ``ctx.resumed``. The ledger gets its start (S) and success (D) lines as
    :func:`run` writes them, and ``<ledger>.progress`` one line per step:
    ``id attempt resumed_from done epoch pid``. A payload without ``seconds`` is quick:
    :func:`run`."""
    if "seconds" not in payload:
        run(payload, ctx)
        return
    ident, total, every = payload["id"], float(payload["seconds"]), float(payload["every"])
    _write(f"{ident} {ctx.attempt} {time.time():.6f} S {os.getpid()} {ctx.source}\n")
    resumed = float(ctx.resumed["done"]) if ctx.resumed else 0.0
    done = resumed
    with open(os.environ["ASYNCTIER_TEST_LEDGER"] + ".progress", "a") as progress:
        while done < total:
            time.sleep(every)
            done = min(total, done + every)
            ctx.checkpoint({"done": done})
            progress.write(f"{ident} {ctx.attempt} {resumed:g} {done:g} {time.time():.6f} "
                           f"{os.getpid()}\n")
            progress.flush()
    _write(f"{ident} {ctx.attempt} {time.time():.6f} D {os.getpid()} {ctx.source}\n")
