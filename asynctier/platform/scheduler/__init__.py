"""The scheduler: the RPC server that runs bound functions on submitted batches.

Modules: :mod:`.server` (process entry points), :mod:`.core` (the submit call),
:mod:`.dispatch` (admission and workers), :mod:`.bounded` and :mod:`.queues` (the bounded
fair queue: priority tiers and tenant fairness), :mod:`.sizing` (chunk sizes),
:mod:`.runtime` (running functions), :mod:`.resolver` (allowed modules), :mod:`.payloads`
(decoding), :mod:`.outcomes`, :mod:`.bindings`, :mod:`.membership` (Redis heartbeats and
the directory tailers read), :mod:`.options`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562), so that a worker process of ``--isolation process``
# (:mod:`.worker_main`) imports what it needs only, not the server, gRPC and Redis.
_EXPORTS = {
    "FollowedBindings": "bindings",
    "StaticBindings": "bindings",
    "Scheduler": "core",
    "SchedulerDirectory": "membership",
    "live_members": "membership",
    "live_schedulers": "membership",
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
