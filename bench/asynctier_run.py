"""asynctier as a contender: ``asynctier bind`` then the default ``asynctier run``.

Each run gets its own prefix (so its own consumer groups, delay topics and Redis keys)
and its own scheduler port; its processes log to a file in the run's folder and are
stopped (SIGTERM, then SIGKILL after a deadline) when it ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from asynctier.dev.process import free_port
from asynctier.platform.binding import PRIORITIES
from bench.measure import BenchError, Finder
from bench.stack import Services

REPO = Path(__file__).resolve().parent.parent
COMPONENTS = ("scheduler", "tailers", "delay")
#: Extra options of every ``asynctier run`` of this bench (``bench/run.py --run-args``), to
#: compare a setting against the default in one machine's conditions.
RUN_ARGS: list[str] = []


class AsynctierRun:
    """One isolated asynctier platform (prefix, port, log folder), run from ``checkout``
    (this one by default; ``bench/ab.py`` passes another to compare two)."""

    def __init__(self, services: Services, folder: Path, label: str,
                 extra_env: dict[str, str] | None = None,
                 checkout: Path = REPO) -> None:
        self.checkout = checkout
        self.services = services
        self.folder = folder
        self.label = label
        self.prefix = f"bench-{label}-{uuid.uuid4().hex[:6]}"
        self.port = free_port()
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        #: With :meth:`start_spread`, each component in a process of its own.
        self.spread: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.log = folder / f"asynctier-{label}.log"

    def env(self) -> dict[str, str]:
        """The environment of every asynctier command of this run."""
        env = dict(os.environ)
        address = f"127.0.0.1:{self.port}"
        env.update({
            "ASYNCTIER_KAFKA_BOOTSTRAP": self.services.kafka_bootstrap,
            "ASYNCTIER_REDIS_URL": self.services.redis_url,
            "ASYNCTIER_PREFIX": self.prefix,
            "ASYNCTIER_ALLOW_MODULES": "bench.noop",
            "ASYNCTIER_SCHEDULER_LISTEN": address,
            "ASYNCTIER_SCHEDULERS": address,
            "PYTHONPATH": str(self.checkout) + os.pathsep + env.get("PYTHONPATH", ""),
            **self.extra_env,
        })
        return env

    def group(self, binding: str) -> str:
        """The consumer group of ``binding``'s tailer."""
        return f"{self.prefix}.{binding}"

    def bind(self, name: str, topic: str, function: str, *extra: str) -> None:
        """``asynctier bind NAME --topic T --function bench.noop:FUNCTION ...``."""
        argv = [sys.executable, "-m", "asynctier", "bind", name, "--topic", topic,
                "--function", f"bench.noop:{function}", *extra]
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=120, cwd=self.checkout, check=False)
        if done.returncode != 0:
            raise BenchError(f"asynctier bind failed:\n{done.stdout}{done.stderr}")

    def bind_queue(self, name: str, topic: str, function: str, *extra: str) -> None:
        """``asynctier bind NAME --queue T --function bench.noop:FUNCTION ...`` (the queue
        shards come from ``ASYNCTIER_QUEUE_SHARDS`` in the run's environment)."""
        argv = [sys.executable, "-m", "asynctier", "bind", name, "--queue", topic,
                "--function", f"bench.noop:{function}", *extra]
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=120, cwd=self.checkout, check=False)
        if done.returncode != 0:
            raise BenchError(f"asynctier bind --queue failed:\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the default ``asynctier run`` (scheduler, tailers, delay tailers)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "asynctier", "run", "--allow-module", "bench.noop",
                 "--submitter-listen", f"127.0.0.1:{free_port()}", *RUN_ARGS],
                env=self.env(), stdout=out, stderr=out, cwd=self.checkout,
                start_new_session=True)

    def start_spread(self, schedulers: int, tailers: int) -> None:
        """``schedulers`` schedulers of every tier and as many kept for the urgent tier,
        ``tailers`` tailers processes per priority tier and one of delay tailers, each
        ``asynctier run COMPONENT`` on its own, as a bare ``asynctier run`` splits them and
        a deployment over several machines would run them: the tailers find the
        schedulers in Redis. Each in a session of its own, so in a CPU autogroup of its
        own, as each would have a cgroup of its own in a deployment (in one session, the
        general schedulers' threads outnumber the urgent ones': bench/RESULTS.md)."""
        ports = [free_port() for _ in range(2 * schedulers)]
        self.extra_env["ASYNCTIER_SCHEDULERS"] = ",".join(f"127.0.0.1:{p}" for p in ports)
        argvs = [["scheduler", "--allow-module", "bench.noop", "--listen", f"127.0.0.1:{p}",
                  *(["--tier", "urgent"] if n % 2 else [])] for n, p in enumerate(ports)]
        argvs += [["tailers", "--tier", tier] for tier in PRIORITIES for _ in range(tailers)]
        argvs += [["delay"]]
        with open(self.log, "ab") as out:
            for argv in argvs:
                self.spread.append((argv[0], subprocess.Popen(
                    [sys.executable, "-m", "asynctier", "run", *argv], env=self.env(),
                    stdout=out, stderr=out, cwd=self.checkout, start_new_session=True)))

    def component(self, name: str) -> Finder:
        """A finder for the child process that runs ``name`` (scheduler, tailers, delay)."""
        def find() -> list[psutil.Process]:
            if self.proc is None:
                return []
            try:
                children = psutil.Process(self.proc.pid).children()
                return [c for c in children if _runs(c, name)]
            except psutil.NoSuchProcess:
                return []
        return find

    def parent(self) -> Finder:
        """A finder for the ``asynctier run`` process itself."""
        def find() -> list[psutil.Process]:
            if self.proc is None or self.proc.poll() is not None:
                return []
            return [psutil.Process(self.proc.pid)]
        return find

    def pids(self) -> dict[str, int]:
        """Component name -> pid, for the profiler: of several (a tailers process per
        tier), the one that used the most CPU so far."""
        found: dict[str, int] = {}
        for name in COMPONENTS:
            procs = list(self.component(name)())
            if procs:
                found[name] = max(procs, key=_cpu_s).pid
        return found

    def check(self) -> Callable[[], None]:
        """A check for :func:`~bench.measure.watch_drain`: raises when the platform died."""
        def alive() -> None:
            for proc in [p for p in [self.proc] if p is not None] + [p for _, p in self.spread]:
                if proc.poll() is not None:
                    raise BenchError(f"asynctier run exited with {proc.returncode}:\n"
                                     f"{self.log_tail()}")
        return alive

    def log_tail(self) -> str:
        """The end of this run's log."""
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (tailers finish and commit, then the scheduler stops); SIGKILL late."""
        # spread: tailers first (they finish their calls), then the delay tailers and
        # the schedulers; the worst exit code
        codes = [_stop(proc, timeout_s)
                 for _, proc in sorted(self.spread, key=lambda c: c[0] != "tailers")]
        if self.proc is None:
            return max(codes, key=abs) if codes else None
        return _stop(self.proc, timeout_s)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM ``proc``, wait up to ``timeout_s``, then SIGKILL its process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def _cpu_s(proc: psutil.Process) -> float:
    try:
        return sum(proc.cpu_times()[:2])
    except psutil.Error:
        return 0.0


def _runs(proc: psutil.Process, component: str) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return "run" in argv and component in argv
