"""``asynctier run [scheduler | tailers | delay | submitter | console]``: run the platform's
processes (``console``: the operator console, configured by ``ASYNCTIER_CONSOLE_*``; see
``asynctier console``).

With no component named, they run as child processes of this one (:data:`CHILDREN`: the
scheduler and one kept for the urgent tier, a tailers process per priority tier, the delay
tailers and the Submitter; the schedulers start first, the others once they are
registered, so that no tier's first calls go to another tier's scheduler); SIGTERM or
Ctrl-C stops the Submitter (it finishes the calls
under way), the tailers (they finish and commit their in-flight batches), then the
schedulers, and exits 0. A tier's tailers process (``run tailers --tier T``) runs the
tailers of that tier's bindings only, at the tier's CPU niceness
(:data:`~asynctier.platform.binding.NICENESS`), as its worker processes do, and sends to
the schedulers kept for its tier first (``run scheduler --tier T``): a flood of batch
records, read, sent and run beside urgent ones in one process, took the urgent ones' share
of its GIL, its event loop and the CPU. A child that dies is reported (how it
ended) and the others are stopped: it exits 1, for its own supervisor to restart (see
docs/operations.md, Running). Inside each child, a tailer or loop that fails is restarted
by :mod:`asynctier.platform.supervise`.

Metrics and health: each process serves its own ``/metrics``, ``/healthz`` and
``/readyz`` (:mod:`asynctier.platform.health`). With ``--metrics-port P`` the scheduler
uses P, the urgent tailers P+1, the delay tailers P+2, the Submitter P+3, the normal
tailers P+4, the batch tailers P+5 and the urgent scheduler P+6 (:data:`CHILDREN`); a
single component uses P.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import click

from asynctier.cli import settings_of
from asynctier.cli.gcpolicy import quiet_gc
from asynctier.platform import tracing
from asynctier.platform.binding import NICENESS, PRIORITIES, Binding
from asynctier.platform.config import Settings
from asynctier.platform.health import Health, beat_forever, redis_check
from asynctier.platform.health import serve as serve_health
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.signals import stop_on_signals, wait_for_stop
from asynctier.platform.status import StatusBoard
from asynctier.platform.supervise import Supervisor, watch
from asynctier.submitter.service import SubmitterOptions
from asynctier.tailers.options import TailerOptions

log = logging.getLogger("asynctier.run")

COMPONENTS = ("scheduler", "tailers", "delay", "submitter")
#: The child processes of a bare ``asynctier run``, in the order they start: (name,
#: component, tier, offset of its metrics port from ``--metrics-port``). The urgent
#: tier has a scheduler kept for it (on a free port of the scheduler's host), so that its
#: calls do not wait behind the other tiers' on one event loop and GIL.
CHILDREN: tuple[tuple[str, str, str | None, int], ...] = (
    ("scheduler", "scheduler", None, 0),
    ("scheduler urgent", "scheduler", "urgent", 6),
    ("tailers urgent", "tailers", "urgent", 1),
    ("tailers normal", "tailers", "normal", 4),
    ("tailers batch", "tailers", "batch", 5),
    ("delay", "delay", None, 2),
    ("submitter", "submitter", None, 3),
)


def scheduler_addresses(settings: Settings) -> Callable[[], Sequence[str]]:
    """Live schedulers from Redis membership, falling back to the configured list."""
    from asynctier.platform.membership import SchedulerDirectory

    return SchedulerDirectory(settings).addresses


def scheduler_client(settings: Settings, tier: str | None = None) -> SchedulerClient:
    """A client on the live schedulers (those kept for ``tier`` first) that keeps calls in
    this process's region while it can (:mod:`asynctier.platform.placement`)."""
    from asynctier.platform.membership import default_client

    return default_client(settings, tier=tier)


def run_tailers(settings: Settings, stop: threading.Event, options: TailerOptions,
                export_lag: bool = False, health: Health | None = None,
                tier: str | None = None) -> None:
    """Run one tailer per binding (of priority ``tier`` only, when given) until ``stop``;
    then finish, commit and return.

    With ``export_lag`` the process also exports its bindings' consumer lag, and its queue
    bindings' depth. ``health`` gets the process's liveness and readiness checks."""
    from asynctier.dev.faults import FaultHook
    from asynctier.platform.lag import LagCollector
    from asynctier.queue.backlog import QueueDepthCollector
    from asynctier.tailers.manager import TailerManager

    quiet_gc()
    health = health or Health()
    beat = health.loop("main loop")
    started = threading.Event()
    health.ready_check("bindings", lambda: None if started.is_set()
                       else "starting: reading the bindings registry")
    board = StatusBoard(settings, "tailers" if tier is None else f"tailers {tier}")
    client = scheduler_client(settings, tier)
    only = None if tier is None else _of_tier(tier)
    manager = TailerManager(settings, client, options, only=only,
                            hook=FaultHook.from_env().reached)
    manager.start()
    started.set()
    board.start()
    log.info("tailers%s running for %d binding(s): %s", "" if tier is None else f" ({tier})",
             len(manager.bindings),
             ", ".join(manager.bindings) or "none yet (waiting for `asynctier bind`)")
    schedules = _start_schedules(settings, stop)
    lag = LagCollector(settings, manager.followed, interval_s=5.0)
    depth = QueueDepthCollector(settings, manager.followed, interval_s=5.0)
    if export_lag:
        lag.start()
        depth.start()
    wait_for_stop(stop, beat)
    manager.stop()
    schedules.join(STOP_SCHEDULES_S)
    board.stop()
    client.close()
    if export_lag:
        lag.stop()
        depth.stop()


def _of_tier(tier: str) -> Callable[[Binding], bool]:
    """Whether a binding is of priority ``tier``."""
    return lambda binding: binding.priority == tier


#: How long a stopping process waits for its schedule loop's round under way.
STOP_SCHEDULES_S = 5.0


def _start_schedules(settings: Settings, stop: threading.Event) -> Supervisor:
    """The schedule loop of this tailers process (docs/design.md, Schedules: it lives with
    the tailers, which already talk to the queue's PostgreSQL; the scheduler never does)."""
    from asynctier.queue.shards import ShardedQueue
    from asynctier.schedules.loop import ScheduleLoop, start_relays

    queue = ShardedQueue.from_settings(settings, pool_size=2)
    start_relays(settings, queue, stop)
    return Supervisor("schedules", ScheduleLoop(queue).run, stop, what="the schedule loop",
                      hint="is the queue's PostgreSQL up? (`asynctier queue shards`)").start()


def _serve_metrics(port: int | None, health: Health) -> None:
    if port is not None:
        serve_health(port, health)  # logs the port it bound


def readiness(health: Health) -> str:
    """A process's readiness as a status line: ``running``, or ``not ready: <why>``."""
    why = health.not_ready()
    return "running" if not why else "not ready: " + "; ".join(
        f"{name}: {reason}" for name, reason in sorted(why.items()))


def _on_serving(health: Health, settings: Settings) -> Callable[[str], None]:
    """The ``ready_callback`` of a server (scheduler, Submitter): called on its event loop
    once it serves; from then on the loop's turns are its liveness, and it is ready while
    Redis answers."""
    serving = threading.Event()
    health.ready_check("serving", lambda: None if serving.is_set() else "starting")

    def ready(address: str) -> None:
        health.ready_check("redis", redis_check(settings))
        beat = health.loop("event loop")
        watch(asyncio.get_running_loop().create_task(beat_forever(beat)), "the health beat")
        serving.set()

    return ready


def _run_one(settings: Settings, component: str, allow: tuple[str, ...], listen: str | None,
             metrics_port: int | None, options: TailerOptions,
             submitter_listen: str | None = None,
             submitter_options: SubmitterOptions | None = None,
             tier: str | None = None) -> None:
    stop = threading.Event()
    stop_on_signals(stop)
    health = Health()
    health.stopping_on(stop)  # not ready from the SIGTERM on, before the drain
    _serve_metrics(metrics_port, health)
    if component == "scheduler":
        from asynctier.scheduler import run_scheduler
        from asynctier.scheduler.limits import AdmissionConfig, RedisAdmission
        from asynctier.scheduler.limits.breaker import Breakers
        from asynctier.scheduler.limits.tenants import TenantStore
        from asynctier.scheduler.options import options_from_settings

        quiet_gc()
        scheduler_options = replace(options_from_settings(settings), tier=tier)
        admission = RedisAdmission(settings,
                                   AdmissionConfig(done_ttl_s=settings.run_once_window_s))
        run_scheduler(settings, listen=listen or settings.scheduler_listen,
                      allow_modules=allow or settings.allow_modules, stop=stop,
                      admission=admission, guard=admission.guard,
                      options=scheduler_options,
                      breakers=Breakers.from_settings(settings),
                      tenants=TenantStore.from_settings(settings),
                      ready_callback=_on_serving(health, settings))
    elif component == "submitter":
        from asynctier.submitter.server import run_submitter

        where = submitter_listen or settings.submitter_listen
        board = StatusBoard(settings, "submitter",
                            extra=lambda: {f"submitter {where}": readiness(health)})
        board.start()
        try:
            run_submitter(settings, listen=where, stop=stop, options=submitter_options,
                          ready_callback=_on_serving(health, settings))
        finally:
            board.stop()
    elif component == "tailers":
        run_tailers(settings, stop, options, export_lag=metrics_port is not None,
                    health=health, tier=tier)
    else:
        run_delay(settings, stop, export_lag=metrics_port is not None, health=health)


def run_delay(settings: Settings, stop: threading.Event, export_lag: bool = False,
              health: Health | None = None) -> None:
    """Run the delay tailers until ``stop`` (and export the delay topics' lag)."""
    from asynctier.dev.faults import FaultHook
    from asynctier.platform.lag import LagCollector
    from asynctier.tailers.delay import run_delay_tailers

    quiet_gc()
    health = health or Health()
    beat = health.loop("main loop")
    assigned = threading.Event()
    health.ready_check("delay tailers", lambda: None if assigned.is_set()
                       else "starting: waiting for the delay topics' first assignment")
    board = StatusBoard(settings, "delay")
    board.start()
    lag = LagCollector(settings, dict, include_bindings=False, delay=True, interval_s=5.0)
    if export_lag:
        lag.start()
    client = scheduler_client(settings)
    run_delay_tailers(settings, stop, client=client, ready=assigned.set,
                      hook=FaultHook.from_env().reached, beat=beat)
    board.stop()
    client.close()
    if export_lag:
        lag.stop()


def _child_args(component: str, allow: tuple[str, ...], listen: str | None,
                port: int | None, options: TailerOptions,
                submitter_listen: str | None = None, tier: str | None = None) -> list[str]:
    args = [sys.executable, "-m", "asynctier", "run", component,
            "--batch-size", str(options.batch_size),
            "--max-in-flight", str(options.max_in_flight)]
    if tier is not None:
        args += ["--tier", tier]
    for module in allow:
        args += ["--allow-module", module]
    if listen and component == "scheduler":
        args += ["--listen", listen]
    if submitter_listen and component == "submitter":
        args += ["--submitter-listen", submitter_listen]
    if port is not None:
        args += ["--metrics-port", str(port)]
    return args


#: How long a bare run waits for its schedulers to register before it starts the other
#: processes anyway.
SCHEDULERS_START_S = 30.0


def _await_schedulers(settings: Settings, children: dict[str, subprocess.Popen[bytes]],
                      stop: threading.Event) -> None:
    """Return once a scheduler of every tier and one of each tier kept by a child are
    registered (:data:`CHILDREN`), a child has died, or after :data:`SCHEDULERS_START_S`.
    Before that a tailer would send its tier's calls to whichever registered first: an
    urgent scheduler would take a batch backlog's first calls, and hold them."""
    from asynctier.platform.errors import ServiceError
    from asynctier.platform.membership import live_members

    wanted = {tier for _, component, tier, _ in CHILDREN if component == "scheduler"}
    deadline = time.monotonic() + SCHEDULERS_START_S
    while not stop.is_set() and all(c.poll() is None for c in children.values()):
        try:
            if wanted <= {m.tier for m in live_members(settings)}:
                return
        except ServiceError:
            pass  # the schedulers cannot register either: the deadline says it
        if time.monotonic() > deadline:
            log.warning("the schedulers did not register in Redis at %s within %.0f s; "
                        "starting the tailers anyway (a tier's calls go to any scheduler "
                        "registered until its own is): see the schedulers' log above",
                        settings.redis_display, SCHEDULERS_START_S)
            return
        stop.wait(0.1)


def _run_all(settings: Settings, allow: tuple[str, ...], listen: str | None,
             metrics_port: int | None, options: TailerOptions, submitter_listen: str | None,
             scheduler_host: str) -> None:
    stop = threading.Event()
    stop_on_signals(stop)
    children: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, component: str, tier: str | None, offset: int) -> None:
        port = None if metrics_port is None else (metrics_port + offset if metrics_port else 0)
        where = f"{scheduler_host}:0" if component == "scheduler" and tier else listen
        children[name] = subprocess.Popen(
            _child_args(component, allow, where, port, options, submitter_listen, tier))

    for entry in CHILDREN:  # the schedulers first, the others once they serve
        if entry[1] == "scheduler":
            start(*entry)
    _await_schedulers(settings, children, stop)
    for entry in CHILDREN:
        if entry[1] != "scheduler" and not stop.is_set():
            start(*entry)
    log.info("asynctier running: %s",
             ", ".join(f"{name} (pid {child.pid})" for name, child in children.items()))
    code = 0
    while not stop.is_set():
        for component, child in children.items():
            if child.poll() is not None:
                log.error("the %s process (pid %d) %s; stopping the others and exiting 1, "
                          "so that the supervisor running `asynctier run` (systemd, "
                          "Kubernetes, docker restart policy) starts the platform again. "
                          "Its log above says why; nothing it had not committed is lost.",
                          component, child.pid, _how_it_ended(child.returncode))
                code = 1
                stop.set()
        stop.wait(0.5)
    for stage in STOP_ORDER:
        running = [name for name in stage
                   if name in children and children[name].poll() is None]
        for name in running:
            children[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60.0
        for name in running:
            _wait(children[name], max(0.0, deadline - time.monotonic()), name)
    sys.exit(code)


#: Who is stopped first: the Submitter, the tailers (together), the delay tailers, then
#: the schedulers they hand their last outcomes to; each stage waits for the one before.
STOP_ORDER = tuple(tuple(name for name, of, _, _ in CHILDREN if of == component)
                   for component in ("submitter", "tailers", "delay", "scheduler"))


def _how_it_ended(code: int) -> str:
    """``exited with code 3``, or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _wait(child: subprocess.Popen[bytes], timeout_s: float, name: str) -> None:
    deadline = time.monotonic() + timeout_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if child.poll() is None:
        log.error("the %s process did not stop within %gs; killing it", name, timeout_s)
        child.kill()
        child.wait()


#: The tailers' knobs as the command line leaves them.
DEFAULTS = TailerOptions()


@click.command()
@click.argument("component", required=False, type=click.Choice((*COMPONENTS, "console")))
@click.option("--allow-module", "allow", multiple=True, metavar="PREFIX",
              help="Module (prefix) whose functions the scheduler may run; repeatable. "
                   "Also allow_modules in asynctier.toml or ASYNCTIER_ALLOW_MODULES.")
@click.option("--listen", envvar="ASYNCTIER_SCHEDULER_LISTEN",
              help="host:port the scheduler serves on [default: 127.0.0.1:50051].")
@click.option("--submitter-listen", envvar="ASYNCTIER_SUBMITTER_LISTEN",
              help="host:port the Submitter serves on [default: 127.0.0.1:50061; "
                   "submitter_listen in asynctier.toml].")
@click.option("--max-backlog", type=click.IntRange(min=1), default=1_000_000,
              show_default=True,
              help="Submitter: a topic's backlog (ready + delayed queue items, or a Kafka "
                   "binding's lag) past which its new workloads are throttled.")
@click.option("--max-pending", type=click.IntRange(min=1), default=100_000,
              show_default=True,
              help="Submitter: workloads under way at most; calls past it get "
                   "RESOURCE_EXHAUSTED with a retry-after.")
@click.option("--metrics-port", type=int, envvar="ASYNCTIER_METRICS_PORT",
              help="Serve /metrics (0: a free port, printed at start).")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=DEFAULTS.batch_size,
              show_default=True, help="Records a tailer reads and submits at once.")
@click.option("--max-in-flight", type=click.IntRange(1, 8), default=DEFAULTS.max_in_flight,
              show_default=True,
              help="Batches a tailer has at the scheduler at once: more keep records "
                   "from waiting in the tailer while earlier batches are claimed, run and "
                   "written down (lower latency under load), and a killed tailer's "
                   "uncommitted window grows by one batch each (what a binding bound "
                   "--idempotent may run twice).")
@click.option("--tier", type=click.Choice(PRIORITIES),
              help="tailers: run only the tailers of bindings of this priority, and send "
                   "their calls to the schedulers kept for it first; scheduler: be kept "
                   "for it (tailers of that tier send to it first). Either runs at the "
                   "tier's CPU niceness (" + ", ".join(f"{t} {n}" for t, n in NICENESS.items())
                   + "). A bare `asynctier run` starts a tailers process per tier and an "
                   "urgent scheduler [default: every tier, the niceness it was started at].")
@click.pass_context
def run(ctx: click.Context, component: str | None, allow: tuple[str, ...], listen: str | None,
        metrics_port: int | None, batch_size: int, max_in_flight: int,
        submitter_listen: str | None, max_backlog: int, max_pending: int,
        tier: str | None) -> None:
    """Run the scheduler, the tailers (one process per priority tier), the delay tailers
    and the Submitter (all of them when none is named)."""
    if tier is not None and component not in ("tailers", "scheduler"):
        raise click.UsageError("--tier is for `asynctier run tailers` and `asynctier run "
                               "scheduler` (a bare `asynctier run` already starts a "
                               "tailers process per tier and an urgent scheduler)")
    if tier is not None:
        os.nice(NICENESS[tier])  # first, so that every thread of the process inherits it
    settings = settings_of(ctx)
    if component == "console":  # not part of a bare `run`: it has its own login to set
        from asynctier.cli.console import options_from_env
        from asynctier.console import serve

        serve(settings, options_from_env())
        return
    if metrics_port is None and settings.metrics_port:
        metrics_port = settings.metrics_port
    options = TailerOptions(batch_size=batch_size, max_in_flight=max_in_flight)
    if component is None:
        host = (listen or settings.scheduler_listen).rsplit(":", 1)[0]
        _run_all(settings, allow, listen, metrics_port, options, submitter_listen, host)
    else:
        with tracing.running(settings.tracing, component):  # [tracing]: spans of this process
            _run_one(settings, component, allow, listen, metrics_port, options,
                     submitter_listen,
                     SubmitterOptions(max_backlog=max_backlog, max_pending=max_pending),
                     tier)


COMMANDS = [run]
