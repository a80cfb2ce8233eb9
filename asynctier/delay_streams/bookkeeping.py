"""The bindings a delay process knows, and the delay intervals it must tail.

The delay tailers look a released record's binding up by its ``asynctier.binding`` header.
:class:`BindingBook` holds the bindings the registry follower reported; a name it does not
know is looked up once more in the registry (each name at most every few seconds) before the
record is treated as belonging to a removed binding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.durations import parse_duration
from asynctier.platform.kafka import admin
from asynctier.platform.registry import BindingRegistry

log = logging.getLogger(__name__)


class BindingBook:
    """Thread-safe name -> Binding, fed by a RegistryFollower."""

    def __init__(self, settings: Settings, reload_every_s: float = 5.0) -> None:
        self.registry = BindingRegistry(settings)
        self._bindings: dict[str, Binding] = {}
        self._lock = threading.Lock()
        #: The paused bindings (:mod:`asynctier.platform.paused`): their due records wait.
        self.paused: frozenset[str] = frozenset()
        self._reload_every_s = reload_every_s
        # names a fresh read of the registry did not have, and when it was read
        self._missing: dict[str, float] = {}

    def update(self, bindings: dict[str, Binding]) -> None:
        """Replace what is known (the follower's latest view)."""
        with self._lock:
            self._bindings = dict(bindings)

    def set_paused(self, names: frozenset[str]) -> None:
        """Replace the paused set (the pause follower's latest read)."""
        self.paused = names

    def all(self) -> list[Binding]:
        """Every known binding."""
        with self._lock:
            return list(self._bindings.values())

    def get(self, name: str) -> Binding | None:
        """The binding named ``name``, or None when the registry says it does not exist.

        A name not known here is looked up in the registry itself (each name at most once
        per ``reload_every_s``): the follower may not have reported a new binding yet, and
        its records must not become dead letters on a guess. Raises AsynctierError when the
        registry cannot be read (the caller reads the records again later).
        """
        with self._lock:
            found = self._bindings.get(name)
            if found is not None:
                return found
            checked = self._missing.get(name)
            if checked is not None and time.monotonic() - checked < self._reload_every_s:
                return None
        fresh = self.registry.load()
        self.update(fresh)
        found = fresh.get(name)
        if found is None:
            with self._lock:
                if len(self._missing) >= 1000:
                    self._missing.clear()
                self._missing[name] = time.monotonic()
        return found


def ladder_intervals(bindings: Iterable[Binding]) -> set[float]:
    """Every interval (seconds) that some binding's ladder uses."""
    return {step for binding in bindings for step in binding.retries.ladder_s}


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
