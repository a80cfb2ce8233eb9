"""The scheduler process: the submit RPC on a ``grpc.aio`` server, membership, shutdown.

Entry points:

* :func:`run_scheduler` - blocking, for the CLI (``asynctier run scheduler``).
* :func:`serve_scheduler` - the same as a coroutine, for callers that own an event loop.

Shutdown is graceful: the scheduler leaves the membership (tailers stop picking it), stops
accepting calls (new ones get UNAVAILABLE and go to another scheduler), lets the calls
under way finish within ``options.stop_grace_s``, then stops its workers and returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from asynctier.platform import eventloop
from asynctier.platform.binding_source import BindingSource, FollowedBindings
from asynctier.platform.config import Settings
from asynctier.platform.framed import RegistryClients
from asynctier.platform.rpc import submit_handler
from asynctier.platform.rpcsecurity import add_port, server_interceptors
from asynctier.platform.rpcserver import SERVER_OPTIONS, advertised
from asynctier.scheduler.admission import Admission, OpenAdmission
from asynctier.scheduler.core import Scheduler
from asynctier.scheduler.guard import Guard
from asynctier.scheduler.heartbeat import Heartbeat
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.options import SchedulerOptions
from asynctier.scheduler.resolver import FunctionResolver
from asynctier.scheduler.runtime import Runtime
from asynctier.scheduler.streaming import run_handler

log = logging.getLogger(__name__)

#: Finishing the calls under way longer than this is logged with what was left.
SLOW_STOP_S = 5.0
#: The most a step of the stop after the calls' grace may take (leaving the membership,
#: stopping the workers): a SIGTERM ends the process whatever hangs.
STOP_STEP_S = 10.0
#: How often a ``threading.Event`` stop is looked at.
STOP_POLL_S = 0.1

StopSignal = threading.Event | asyncio.Event
ReadyCallback = Callable[[str], None]

def run_scheduler(settings: Settings, *, listen: str | None = None,
                  allow_modules: Iterable[str] | None = None,
                  admission: Admission | None = None, stop: StopSignal | None = None,
                  ready_callback: ReadyCallback | None = None,
                  options: SchedulerOptions | None = None,
                  bindings: BindingSource | None = None,
                  advertise: str | None = None, breakers: Breakers | None = None,
                  tenants: TenantStore | None = None, guard: Guard | None = None) -> None:
    """Run a scheduler until ``stop`` is set (or SIGTERM / SIGINT); blocks.

    ``listen`` is ``host:port`` (default ``settings.scheduler_listen``; port 0 picks a free
    port). ``allow_modules`` are the module prefixes whose functions may run (default
    ``settings.allow_modules``). ``admission`` is the limits implementation (default
    :class:`OpenAdmission`: no limits); it is closed on exit. ``stop``: a
    ``threading.Event`` (or an ``asyncio.Event`` of this loop) that ends the scheduler
    gracefully; when None and called from the main thread, SIGTERM and SIGINT do, and
    when a ``stop`` is given the caller owns signal handling. ``ready_callback(address)``
    is called once the server accepts calls, with the address registered in Redis
    (``advertise``, else the listen address with its real port; a wildcard host becomes
    this machine's host name). ``bindings`` defaults to the registry, followed live.
    ``breakers``: the bindings' circuit breakers (none: ``--breaker`` is not enforced);
    closed on exit. ``tenants``: where tenants' weights are followed and their usage
    shared (none: the options' weights only). ``guard``: runs each record once (none:
    :class:`~.guard.OpenGuard`, every record runs); closed on exit.
    """
    eventloop.run(serve_scheduler(
        settings, listen=listen, allow_modules=allow_modules, admission=admission,
        stop=stop, ready_callback=ready_callback, options=options, bindings=bindings,
        advertise=advertise, breakers=breakers, tenants=tenants, guard=guard))


async def serve_scheduler(settings: Settings, *, listen: str | None = None,
                          allow_modules: Iterable[str] | None = None,
                          admission: Admission | None = None,
                          stop: StopSignal | None = None,
                          ready_callback: ReadyCallback | None = None,
                          options: SchedulerOptions | None = None,
                          bindings: BindingSource | None = None,
                          advertise: str | None = None,
                          breakers: Breakers | None = None,
                          tenants: TenantStore | None = None,
                          guard: Guard | None = None) -> None:
    """:func:`run_scheduler` as a coroutine on the running loop."""
    options = options or SchedulerOptions()
    admission = admission or OpenAdmission()
    stop = stop or _signal_stop()
    resolver = FunctionResolver(settings.allow_modules if allow_modules is None
                                else allow_modules)
    source = bindings
    try:
        if source is None:
            followed = FollowedBindings(settings)
            await asyncio.to_thread(followed.start)
            source = followed
        registries = RegistryClients(settings.schema_registry)
        runtime = Runtime(resolver, options.threads,
                          cpu_bound_item_s=options.cpu_bound_item_s, registries=registries)
        scheduler = Scheduler(source, runtime, admission, options, breakers, tenants, guard)
        await _serve(settings, scheduler, listen or settings.scheduler_listen, stop,
                     ready_callback, advertise)
    finally:
        if source is not None:
            source.close()
        if guard is not None:
            await guard.close()
        await admission.close()
        if breakers is not None:
            await breakers.close()


async def _serve(settings: Settings, scheduler: Scheduler, listen: str, stop: StopSignal,
                 ready_callback: ReadyCallback | None, advertise: str | None) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS,
                             interceptors=server_interceptors(settings.rpc))
    server.add_generic_rpc_handlers((submit_handler(scheduler.submit, run_handler(scheduler)),))
    port = add_port(server, listen, settings.rpc, "scheduler")
    address = advertise or advertised(listen, port)
    scheduler.start()
    await server.start()
    opts = scheduler.options
    heartbeat = Heartbeat(settings, address, lambda: scheduler.load,
                          opts.heartbeat_interval_s, opts.membership_ttl_s,
                          capacity=opts.max_queued_items, tier=opts.tier)
    await heartbeat.beat()
    heartbeat.start()
    _log_start(address, listen, port, scheduler, settings.rpc.describe(), settings.region)
    if ready_callback is not None:
        ready_callback(address)
    try:
        await _wait(stop)
    finally:
        log.info("scheduler %s stopping: leaving the membership, finishing calls under way "
                 "(at most %gs; %d item(s) queued or running)", address, opts.stop_grace_s,
                 scheduler.load)
        started = time.monotonic()
        await _bounded(heartbeat.stop(leave=True), STOP_STEP_S, "leaving the membership",
                       address)
        await server.stop(opts.stop_grace_s)
        took = time.monotonic() - started
        if took > SLOW_STOP_S:  # says what held the stop up, the next time one is slow
            log.warning("scheduler %s: finishing the calls under way took %.1fs; %d item(s) "
                        "still queued or running", address, took, scheduler.load)
        await _bounded(scheduler.stop(), STOP_STEP_S,
                       "stopping its workers, gates, write-downs and worker processes",
                       address)
        log.info("scheduler %s stopped", address)


async def _bounded(step: Any, limit_s: float, what: str, address: str) -> None:
    """Await one step of the stop for at most ``limit_s``: a step that hangs is named in the
    log and left, so that a SIGTERM always ends the process (what it left undone is done
    again elsewhere: items whose outcomes were not answered are sent again)."""
    try:
        await asyncio.wait_for(step, limit_s)
    except TimeoutError:
        log.error("scheduler %s: %s took over %gs; exiting without it", address, what,
                  limit_s)


def _log_start(address: str, listen: str, port: int, scheduler: Scheduler,
               security: str, region: str) -> None:
    allowed = scheduler.runtime.resolver.allow_modules
    opts = scheduler.options
    log.info("scheduler listening on %s (port %d, %s), registered as %s in region %s for "
             "%s; allowed modules: %s; %d workers, queue of at most %d items; event loop %s",
             listen, port, security, address, region,
             "every tier" if opts.tier is None else f"the {opts.tier} tier first",
             ", ".join(allowed) or "none", opts.workers, opts.max_queued_items,
             eventloop.name())
    if not allowed:
        log.warning("no module is allowed: every item will fail with 'module not allowed' "
                    "(start the scheduler with --allow-module PREFIX)")


def _signal_stop() -> StopSignal:
    """An event set by SIGTERM / SIGINT (main thread only; else never set)."""
    event = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, event.set)
    return event


async def _wait(stop: Any) -> None:
    if isinstance(stop, asyncio.Event):
        await stop.wait()
        return
    while not stop.is_set():
        await asyncio.sleep(STOP_POLL_S)
