"""Small tools shared by the tests: deadline-based waiting instead of bare sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, message: str = "",
               interval: float = 0.05, max_interval: float = 0.5) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Polls with a growing interval (at most ``max_interval``) until ``timeout`` seconds have passed,
    then fails the test with ``message`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s: {message or 'condition never held'} "
                f"(last value: {value!r})"
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, max_interval)


async def until(predicate: Callable[[], T], timeout: float = 5.0, message: str = "",
                interval: float = 0.005) -> T:
    """:func:`wait_until` for a coroutine: polls ``predicate`` on the running loop (other
    tasks run between polls) until it returns something truthy, and returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s: {message or 'condition never held'} "
                f"(last value: {value!r})"
            )
        await asyncio.sleep(interval)


class MinuteClock:
    """A clock in epoch ms that runs in real time from a chosen point of a minute (the
    next one, so that keys it dates expire in the future): a test says where in the
    window it starts, and jumps, instead of sleeping or skipping around a minute's turn."""

    def __init__(self, in_minute_ms: int = 1_000) -> None:
        self.jump_to(in_minute_ms)

    def jump_to(self, in_minute_ms: int, minutes_on: int = 0) -> None:
        """From now on, time runs from ``in_minute_ms`` into the minute ``minutes_on``
        after the one it started in."""
        self._real_start = time.monotonic()
        if not hasattr(self, "minute"):
            self.minute = int(time.time() // 60) + 1
        self.minute += minutes_on
        self._start_ms = self.minute * 60_000 + in_minute_ms

    def __call__(self) -> int:
        return self._start_ms + int((time.monotonic() - self._real_start) * 1000)


def record_headers(msg: Any) -> dict[str, bytes | None]:
    """A Kafka record's headers by name (see :func:`headers_by_name`)."""
    return headers_by_name(msg.headers() or ())


def headers_by_name(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, bytes | None]:
    """Headers by name, the last of each, a packed delay header read out into the six it
    holds (as the platform reads them)."""
    from asynctier.delay_streams.handoff import unpack_delay
    from asynctier.platform.names import H_DELAY

    found: dict[str, bytes | None] = {}
    for name, value in headers:
        found.update(unpack_delay(value) if name == H_DELAY else {name: value})
    return found
