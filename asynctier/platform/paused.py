"""Paused bindings: their records stay in their source until the binding is resumed.

A pause is a field of the Redis hash ``<prefix>:paused`` (the binding's name -> ``{"since_ms":
..., "by": ...}``), set by ``asynctier pause`` and the console, followed every second by
the tailer processes (a paused binding's tailer stops after its in-flight batch; resumed,
it starts again from its committed offsets) and by the delay tailers (a paused binding's
retries that come due hop back into the delay topic, no attempt spent). Producing and
submitting go on: the records wait in the topic or the queue. Work already at a scheduler
runs to its end.

The field's presence is the pause; its value only says since when and by whom, and a value
that does not read (written by something else) still pauses, shown as unreadable.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from asynctier.platform.config import Settings
from asynctier.platform.durations import epoch_ms
from asynctier.platform.errors import ServiceError
from asynctier.platform.redis_client import sync_client

log = logging.getLogger(__name__)

#: How often a follower reads the paused set: the bound on how late a pause takes effect.
FOLLOW_EVERY_S = 1.0
#: What ``asynctier bindings``, ``lag`` and the console show for a paused binding.
PAUSED = "paused"


@dataclass(frozen=True)
class Pause:
    """One paused binding: since when (epoch ms) and by whom; ``note`` says why a stored
    value did not read."""

    binding: str
    since_ms: int | None
    by: str
    note: str = ""


def read_pause(binding: str, raw: Any) -> Pause:
    """The pause stored for ``binding`` (``raw``: the hash field's value)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        doc = json.loads(text)
        since, by = doc["since_ms"], doc["by"]
        if not isinstance(since, int) or isinstance(since, bool) or since < 0 \
                or not isinstance(by, str):
            raise ValueError("since_ms is not a time or by is not a name")
    except (ValueError, KeyError, TypeError) as exc:
        return Pause(binding, None, "", f"unreadable value {text[:60]!r} ({exc})")
    return Pause(binding, since, by[:100])


class PauseStore:
    """Pauses in Redis: set, lift, read."""

    def __init__(self, settings: Settings) -> None:
        self.key = settings.names.redis_key("paused")
        self.redis_display = settings.redis_display
        self._client = sync_client(settings.redis_url, socket_timeout=2.0,
                                   socket_connect_timeout=2.0)

    def pause(self, binding: str, by: str) -> Pause:
        """Pause ``binding`` (again: its time and author are replaced)."""
        pause = Pause(binding, epoch_ms(), by)
        self._client.hset(self.key, binding,
                          json.dumps({"since_ms": pause.since_ms, "by": by}))
        return pause

    def resume(self, binding: str) -> bool:
        """Lift ``binding``'s pause; False when it was not paused."""
        return bool(self._client.hdel(self.key, binding))

    def all(self) -> dict[str, Pause]:
        """Every paused binding (redis.RedisError when Redis does not answer)."""
        raw = self._client.hgetall(self.key)
        found = {}
        for field, value in raw.items():
            name = field.decode("utf-8", "replace") if isinstance(field, bytes) else field
            found[name] = read_pause(name, value)
        return found

    def close(self) -> None:
        """Close the connection."""
        self._client.close()


def set_paused(settings: Settings, name: str, paused: bool, by: str) -> bool:
    """Pause binding ``name`` (``by``: who asked) or resume it: what ``asynctier pause``,
    ``resume`` and the console do. True when something changed (resuming a binding that
    is not paused changes nothing); ServiceError when Redis does not answer."""
    store = PauseStore(settings)
    try:
        if paused:
            store.pause(name, by)
            return True
        return store.resume(name)
    except redis.RedisError as exc:
        raise ServiceError(f"Redis at {settings.redis_display} does not answer ({exc}): "
                           f"binding {name} was not {'paused' if paused else 'resumed'}"
                           ) from exc
    finally:
        store.close()


def read_paused(settings: Settings) -> dict[str, Pause]:
    """Every paused binding; empty when Redis does not answer (the caller shows the
    tailers' states, which then read unknown)."""
    store = PauseStore(settings)
    try:
        return store.all()
    except redis.RedisError:
        return {}
    finally:
        store.close()


class PauseFollower:
    """Reads the paused set every :data:`FOLLOW_EVERY_S` and calls ``on_change`` with the
    names when it changed. While Redis does not answer the last set read stays in force
    (said once): nothing is resumed or paused on a guess."""

    def __init__(self, settings: Settings, on_change: Callable[[frozenset[str]], None],
                 every_s: float = FOLLOW_EVERY_S) -> None:
        self.store = PauseStore(settings)
        self.on_change = on_change
        self.every_s = every_s
        self.paused: frozenset[str] = frozenset()
        self._failing = False

    def read_once(self) -> frozenset[str]:
        """Read now; call ``on_change`` when the set changed. Returns the set in force."""
        try:
            pauses = self.store.all()
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("paused bindings: Redis at %s does not answer (%s); the last "
                            "pauses read stay in force until it does", self.store.redis_display,
                            exc)
            self._failing = True
            return self.paused
        if self._failing:
            log.info("paused bindings: Redis answers again")
            self._failing = False
        for pause in pauses.values():
            if pause.note and pause.binding not in self.paused:
                log.warning("binding %s is paused with an %s; `asynctier resume %s` lifts "
                            "it", pause.binding, pause.note, pause.binding)
        names = frozenset(pauses)
        if names != self.paused:
            for name in sorted(names - self.paused):
                log.info("binding %s paused: its records wait in its source until "
                         "`asynctier resume %s`", name, name)
            for name in sorted(self.paused - names):
                log.info("binding %s resumed", name)
            self.paused = names
            self.on_change(names)
        return names

    def run(self, stop: threading.Event) -> None:
        """Follow until ``stop`` (run it under a Supervisor)."""
        while not stop.is_set():
            self.read_once()
            stop.wait(self.every_s)

    def close(self) -> None:
        """Close the connection."""
        self.store.close()
