"""Where the scheduler learns bindings: a fixed set, or the registry followed live."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry, RegistryFollower

log = logging.getLogger(__name__)


class BindingSource(Protocol):
    """The bindings the scheduler knows."""

    def get(self, name: str) -> Binding | None:
        """The binding called ``name``, or None when unknown."""
        ...

    async def refresh(self) -> None:
        """Read the bindings again (an item named a binding not known yet)."""
        ...

    def close(self) -> None:
        """Stop following."""
        ...


class StaticBindings:
    """A fixed set of bindings (tests, embedding)."""

    def __init__(self, bindings: Mapping[str, Binding] | list[Binding]) -> None:
        self.bindings = ({b.name: b for b in bindings} if isinstance(bindings, list)
                         else dict(bindings))

    def get(self, name: str) -> Binding | None:
        """The binding called ``name``."""
        return self.bindings.get(name)

    async def refresh(self) -> None:
        """Nothing to read."""

    def close(self) -> None:
        """Nothing to stop."""


class FollowedBindings:
    """The registry's bindings, followed live by a :class:`RegistryFollower`.

    :meth:`refresh` reads the whole registry again, at most once per ``min_interval_s``;
    callers that ask while a read is under way share it.
    """

    def __init__(self, settings: Settings, min_interval_s: float = 1.0) -> None:
        self.settings = settings
        self.min_interval_s = min_interval_s
        self._view: dict[str, Binding] = {}
        self._follower = RegistryFollower(settings, self._changed)
        self._reload: asyncio.Task[None] | None = None
        self._last_reload = 0.0

    def start(self) -> None:
        """Read the registry whole and follow it (blocking; call before serving)."""
        self._follower.start()

    def _changed(self, bindings: dict[str, Binding]) -> None:
        self._view = bindings

    def get(self, name: str) -> Binding | None:
        """The binding called ``name``."""
        return self._view.get(name)

    async def refresh(self) -> None:
        """Read the registry again, sharing a read under way."""
        if self._reload is None:
            if time.monotonic() - self._last_reload < self.min_interval_s:
                return
            self._reload = asyncio.create_task(self._read())
        await asyncio.shield(self._reload)

    async def _read(self) -> None:
        try:
            loaded = await asyncio.to_thread(BindingRegistry(self.settings).load)
        except Exception as exc:
            log.warning("could not read the bindings registry again: %s", exc)
            return
        finally:
            self._last_reload = time.monotonic()
            self._reload = None
        view = dict(self._view)
        for name, binding in loaded.items():  # the follower's newer news wins
            view.setdefault(name, binding)
        self._view = view

    def close(self) -> None:
        """Stop following."""
        self._follower.stop()
