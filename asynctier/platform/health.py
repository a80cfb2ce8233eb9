"""``/healthz`` and ``/readyz`` beside ``/metrics``: what an orchestrator asks a process.

* ``/healthz`` (alive): the process's loops turn. 200 unless a loop registered with
  :meth:`Health.loop` has not turned for its ``max_age_s`` (a blocked event loop, a hung
  main thread): restart the process then. Its JSON also lists what makes the process not
  ready, so a process that is alive but degraded (Redis away under ``fail_open``) says why.
* ``/readyz`` (ready): consuming or serving, its services reachable. 503 from the moment
  SIGTERM arrives (before the drain), while a supervised loop keeps failing
  (:func:`~asynctier.platform.supervise.failing`), and while a check registered with
  :meth:`Health.ready_check` says why not. Take the process out of rotation then; do not
  restart it for that.

Both answer a short JSON body: ``{"status": "ok" | "not ready" | "dead", "why": {...}}``.
They are served with the metrics by one small WSGI server of the standard library
(prometheus-client's own app answers ``/metrics``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import REGISTRY, make_wsgi_app

from asynctier.platform import supervise
from asynctier.platform.config import Settings
from asynctier.platform.redis_client import sync_client

log = logging.getLogger(__name__)

#: The paths an orchestrator probes (served on the metrics port, beside ``/metrics``).
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"

#: None when fine, else why not (one short line).
Check = Callable[[], str | None]
Clock = Callable[[], float]


class Health:
    """The checks behind one process's ``/healthz`` and ``/readyz``."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._alive: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._lock = threading.Lock()
        self._stop: Any = None

    def ready_check(self, name: str, check: Check) -> None:
        """Add a readiness check (``check()`` returns None when fine, else why)."""
        with self._lock:
            self._ready[name] = check

    def alive_check(self, name: str, check: Check) -> None:
        """Add a liveness check."""
        with self._lock:
            self._alive[name] = check

    def stopping_on(self, stop: threading.Event | Any) -> None:
        """Not ready from the moment ``stop`` is set (SIGTERM): before the drain."""
        self._stop = stop
        self.ready_check("stopping", lambda: "stopping: finishing the work under way"
                         if stop.is_set() else None)

    def loop(self, name: str, max_age_s: float = 30.0) -> Callable[[], None]:
        """A liveness check on loop ``name``: the function returned is called on each of
        its turns; not alive once it has not been called for ``max_age_s`` (not judged
        while stopping: a drain may hold the loop, and killing it then loses the drain)."""
        last = [self.clock()]

        def beat() -> None:
            last[0] = self.clock()

        def check() -> str | None:
            if self._stop is not None and self._stop.is_set():
                return None
            age = self.clock() - last[0]
            return (f"has not turned for {age:.0f}s (more than {max_age_s:g}s): stuck"
                    if age > max_age_s else None)

        self.alive_check(name, check)
        return beat

    def not_alive(self) -> dict[str, str]:
        """The liveness checks that fail, and why."""
        return _run(self._checks(self._alive))

    def not_ready(self) -> dict[str, str]:
        """The readiness checks that fail, and the loops that keep failing."""
        return {**_run(self._checks(self._ready)), **supervise.failing()}

    def _checks(self, checks: dict[str, Check]) -> list[tuple[str, Check]]:
        with self._lock:
            return list(checks.items())

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of ``/healthz``."""
        dead = self.not_alive()
        body: dict[str, Any] = {"status": "dead" if dead else "ok", "why": dead}
        not_ready = self.not_ready()
        if not_ready:
            body["not_ready"] = not_ready
        return (503 if dead else 200), body

    def readyz(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of ``/readyz``."""
        why = {**self.not_alive(), **self.not_ready()}
        return (503 if why else 200), {"status": "not ready" if why else "ok", "why": why}


def redis_check(settings: Settings, every_s: float = 1.0,
                clock: Clock = time.monotonic) -> Check:
    """A readiness check that Redis answers a PING (asked at most every ``every_s``)."""
    client = sync_client(settings.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    last: list[Any] = [-every_s, None]  # when asked, and what it said

    def check() -> str | None:
        if clock() - last[0] >= every_s:
            try:
                client.ping()
                last[1] = None
            except redis.RedisError as exc:
                last[1] = (f"Redis at {settings.redis_display} does not answer ({exc}); "
                           "serving on where the bindings' redis policy allows")
            last[0] = clock()
        return last[1]  # type: ignore[no-any-return]

    return check


async def beat_forever(beat: Callable[[], None], every_s: float = 1.0) -> None:
    """Call ``beat`` every ``every_s`` on the running event loop: its liveness."""
    while True:
        beat()
        await asyncio.sleep(every_s)


def _run(checks: Iterable[tuple[str, Check]]) -> dict[str, str]:
    failed: dict[str, str] = {}
    for name, check in checks:
        try:
            why = check()
        except Exception as exc:  # a broken check says so; it never breaks the endpoint
            why = f"the check failed: {supervise.describe(exc)}"
        if why:
            failed[name] = why
    return failed


def wsgi_app(health: Health) -> Callable[..., Iterable[bytes]]:
    """``/healthz`` and ``/readyz`` from ``health``; anything else is prometheus-client's
    metrics app."""
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in (HEALTHZ_PATH, READYZ_PATH):
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        code, body = health.healthz() if path == HEALTHZ_PATH else health.readyz()
        data = json.dumps(body).encode()
        start_response(f"{code} {'OK' if code == 200 else 'Service Unavailable'}",
                       [("Content-Type", "application/json"),
                        ("Content-Length", str(len(data)))])
        return [data]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


def serve(port: int, health: Health, addr: str = "0.0.0.0") -> int:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` from a daemon
    thread (``port`` 0: a free one); the port bound."""
    server = make_server(addr, port, wsgi_app(health), _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics-health", daemon=True).start()
    real = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics, health on /healthz and /readyz", addr, real)
    return real
