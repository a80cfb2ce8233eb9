"""The bindings a delay process knows, and the delay intervals it must tail.

The delay tailers look a released record's binding up by its ``asynctier.binding`` header.
:class:`BindingBook` holds the bindings the registry follower reported; a name it does not
know is looked up once more in the registry (at most every few seconds) before the record is
treated as belonging to a removed binding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.durations import parse_duration
from asynctier.platform.errors import AsynctierError
from asynctier.platform.kafka import admin
from asynctier.platform.registry import BindingRegistry

log = logging.getLogger(__name__)


class BindingBook:
    """Thread-safe name -> Binding, fed by a RegistryFollower."""

    def __init__(self, settings: Settings, reload_every_s: float = 5.0) -> None:
        self.registry = BindingRegistry(settings)
        self._bindings: dict[str, Binding] = {}
        self._lock = threading.Lock()
        self._reload_every_s = reload_every_s
        self._reloaded_at = 0.0

    def update(self, bindings: dict[str, Binding]) -> None:
        """Replace what is known (the follower's latest view)."""
        with self._lock:
            self._bindings = dict(bindings)

    def all(self) -> list[Binding]:
        """Every known binding."""
        with self._lock:
            return list(self._bindings.values())

    def get(self, name: str) -> Binding | None:
        """The binding named ``name``, or None when it does not exist (any more)."""
        with self._lock:
            found = self._bindings.get(name)
            if found is not None or time.monotonic() - self._reloaded_at < self._reload_every_s:
                return found
            self._reloaded_at = time.monotonic()
        try:
            fresh = self.registry.load()
        except AsynctierError as exc:
            log.warning("could not re-read the bindings to look up %r: %s", name, exc)
            return None
        self.update(fresh)
        return fresh.get(name)


def ladder_intervals(bindings: Iterable[Binding]) -> set[float]:
    """Every interval (seconds) that some binding's ladder uses."""
    return {step for binding in bindings for step in binding.retry_ladder_s}


def existing_delay_intervals(settings: Settings, timeout_s: float = 10.0) -> set[float]:
    """Intervals of the delay topics that exist under this prefix (records may wait there
    even when no binding uses that interval any more)."""
    head = settings.names.delay_topic("")
    found: set[float] = set()
    for topic in admin(settings).list_topics(timeout=timeout_s).topics:
        if topic.startswith(head):
            try:
                found.add(parse_duration(topic[len(head):]))
            except ValueError:
                log.warning("topic %s looks like a delay topic but its interval does not "
                            "parse; it is not tailed", topic)
    return found
