"""Where a process says how its supervised loops do, for ``asynctier bindings``, ``lag``
and the console.

Each tailer, delay and Submitter process publishes, every second, the state of each of its loops
(``running``, ``restarting: <error>``, ``failing: <error>``...) to one Redis hash,
``<prefix>:tailer-status``, under a field of its own (``host:pid:component``) with an
expiry: a process that died drops out once it has passed. A loop is named by its binding
(``orders``), a binding's second loop by ``orders:parked`` or ``orders:queue``, a delay
tailer by ``delay:30s``; a Submitter adds a line of its own, ``submitter <address>``, with
its readiness. The CLI reads the hash whole and gives each binding the worst
state of its own loops and of the delay tailers of its ladder.

Publishing is best effort: with Redis away the tailers go on (logged once), and the CLI
says ``unknown``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import redis

from asynctier.platform.config import Settings
from asynctier.platform.redis_client import SyncRedis, sync_client
from asynctier.platform.supervise import FAILING, RESTARTING, RUNNING, STARTING, loops

log = logging.getLogger(__name__)

#: How often a process publishes, and how long what it published holds.
PUBLISH_EVERY_S = 1.0
EXPIRES_S = 10.0
#: Worst first: the state shown when a binding's loops differ.
_ORDER = (FAILING, RESTARTING, STARTING, RUNNING)
#: A binding no process reports (no tailer runs it, or they have not published yet).
NOT_RUNNING = "not running"
#: Redis could not be read.
UNKNOWN = "unknown"


def status_key(settings: Settings) -> str:
    """The Redis hash of every process's loops."""
    return settings.names.redis_key("tailer-status")


class StatusBoard:
    """The supervised loops of this process (:func:`~asynctier.platform.supervise.loops`),
    published to Redis while it runs."""

    def __init__(self, settings: Settings, component: str,
                 clock: Callable[[], float] = time.time,
                 extra: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.settings = settings
        self.extra = extra  # lines of the process itself (a Submitter's readiness)
        self.key = status_key(settings)
        self.field = f"{socket.gethostname()}:{os.getpid()}:{component}"
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down = False

    def snapshot(self) -> dict[str, str]:
        """Each supervised loop's status line, and the process's own (``extra``)."""
        found = {name: r.shown() for name, r in loops().items()}
        if self.extra is not None:
            found.update(self.extra())
        return found

    def start(self) -> None:
        """Publish every :data:`PUBLISH_EVERY_S` in a thread of its own."""
        self._thread = threading.Thread(target=self._run, name="status-board", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = sync_client(self.settings.redis_url, socket_timeout=1.0,
                             socket_connect_timeout=1.0)
        try:
            while not self._stop.is_set():
                self.publish(client)
                self._stop.wait(PUBLISH_EVERY_S)
            with contextlib.suppress(redis.RedisError):  # else it expires by itself
                client.hdel(self.key, self.field)
        finally:
            client.close()

    def publish(self, client: SyncRedis) -> None:
        """Write this process's loops once; a Redis failure is logged once per outage."""
        now_ms = int(self.clock() * 1000)
        doc = {"expires_ms": now_ms + int(EXPIRES_S * 1000), "loops": self.snapshot()}
        try:
            client.hset(self.key, self.field, json.dumps(doc))
            stale = [f for f, raw in client.hgetall(self.key).items()
                     if _expires(raw) < now_ms - EXPIRES_S * 1000]
            if stale:
                client.hdel(self.key, *stale)
        except redis.RedisError as exc:
            if not self._down:
                log.warning("cannot publish the tailers' states to Redis (%s); they run "
                            "on, and `asynctier bindings` shows them as unknown", exc)
            self._down = True
            return
        self._down = False

    def stop(self) -> None:
        """Stop publishing and take this process's field out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def _expires(raw: bytes | str) -> float:
    try:
        return float(json.loads(raw)["expires_ms"])
    except (ValueError, TypeError, KeyError):
        return 0.0


def read_statuses(settings: Settings, clock: Callable[[], float] = time.time,
                  ) -> dict[str, str] | None:
    """Every live loop's status over all processes (the worst when several run one);
    None when Redis cannot be read."""
    client = sync_client(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        fields = client.hgetall(status_key(settings))
    except redis.RedisError:
        return None
    finally:
        client.close()
    now_ms = clock() * 1000
    merged: dict[str, str] = {}
    for raw in fields.values():
        try:
            doc = json.loads(raw)
            if float(doc["expires_ms"]) < now_ms:
                continue
            loops = {str(k): str(v) for k, v in dict(doc["loops"]).items()}
        except (ValueError, TypeError, KeyError):
            continue  # not ours to judge: another version's field, or garbage
        for name, shown in loops.items():
            merged[name] = worst((merged[name], shown)) if name in merged else shown
    return merged


def _rank(shown: str) -> int:
    state = shown.split(":", 1)[0]
    return _ORDER.index(state) if state in _ORDER else len(_ORDER)


def worst(shown: Iterable[str]) -> str:
    """The worst of some status lines (failing first, then restarting...)."""
    return min(shown, key=_rank)


def binding_status(name: str, ladder: Iterable[str],
                   statuses: Mapping[str, str] | None) -> str:
    """What ``asynctier bindings`` shows for binding ``name`` whose ladder's intervals are
    ``ladder`` (none for a queue binding): the worst of its loops and of those delay
    tailers, the loop named when it is not the binding's own."""
    if statuses is None:
        return UNKNOWN
    mine = [(loop, statuses[loop]) for loop in
            (name, f"{name}:parked", f"{name}:queue", *(f"delay:{i}" for i in ladder))
            if loop in statuses]
    if not any(loop == name for loop, _ in mine):
        return NOT_RUNNING
    loop, shown = min(mine, key=lambda pair: _rank(pair[1]))
    if loop == name or _rank(shown) >= _ORDER.index(RUNNING):
        return shown
    state, _, error = shown.partition(": ")
    return f"{state}: {loop}: {error}" if error else f"{state}: {loop}"
