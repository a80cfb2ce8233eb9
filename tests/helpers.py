"""Small tools shared by the tests: deadline-based waiting instead of bare sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, message: str = "",
               interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Polls with a growing interval (at most 0.5 s) until ``timeout`` seconds have passed,
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
        delay = min(delay * 1.5, 0.5)


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
