"""The scheduler: the RPC server that runs bound functions on submitted batches.

Modules: :mod:`.server` (process entry points), :mod:`.core` (the submit call),
:mod:`.dispatch` (admission and workers), :mod:`.bounded` and :mod:`.queues` (the bounded
fair queue: priority tiers and tenant fairness), :mod:`.sizing` (chunk sizes),
:mod:`.runtime` (running functions), :mod:`.resolver` (allowed modules), :mod:`.payloads`
(decoding), :mod:`.outcomes`, :mod:`.bindings`, :mod:`.membership` (Redis heartbeats and
the directory tailers read), :mod:`.options`.
"""

from asynctier.platform.scheduler.bindings import FollowedBindings, StaticBindings
from asynctier.platform.scheduler.core import Scheduler
from asynctier.platform.scheduler.membership import (
    SchedulerDirectory,
    live_members,
    live_schedulers,
)
from asynctier.platform.scheduler.options import SchedulerOptions
from asynctier.platform.scheduler.resolver import FunctionResolver
from asynctier.platform.scheduler.server import run_scheduler, serve_scheduler

__all__ = [
    "FollowedBindings",
    "FunctionResolver",
    "Scheduler",
    "SchedulerDirectory",
    "SchedulerOptions",
    "StaticBindings",
    "live_members",
    "live_schedulers",
    "run_scheduler",
    "serve_scheduler",
]
