"""The scheduler: the RPC server that admits, orders and runs bound functions on the
batches tailers send it.

Modules: :mod:`.server` (process entry points), :mod:`.core` (the submit call),
:mod:`.dispatch` (admission and workers), :mod:`.admission` and :mod:`.limits` (rate
limits, quotas, caps, breakers, run-once), :mod:`.bounded` and :mod:`.queues` (the bounded
fair queue: priority tiers and tenant fairness), :mod:`.sizing` (chunk sizes),
:mod:`.runtime` (running functions), :mod:`.resolver` (allowed modules), :mod:`.outcomes`,
:mod:`.heartbeat` (its registration in the membership), :mod:`.options`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562), so that a worker process of ``--isolation process``
# (:mod:`.worker_main`) imports what it needs only, not the server, gRPC and Redis.
_EXPORTS = {
    "Scheduler": "core",
    "SchedulerOptions": "options",
    "FunctionResolver": "resolver",
    "run_scheduler": "server",
    "serve_scheduler": "server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
