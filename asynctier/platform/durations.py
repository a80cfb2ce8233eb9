"""Parsing and printing of the short durations used in ladders and flags (``30s``, ``1m``)."""

from __future__ import annotations

import itertools
import re
import time

#: Seconds in a minute and in a day (quota windows, usage keys).
MINUTE_S = 60
DAY_S = 86_400
_UNITS = {"ms": 0.001, "s": 1.0, "m": float(MINUTE_S), "h": 3600.0, "d": float(DAY_S)}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``30s``, ``1m``, ``5m``, ``1h``, ``250ms``, or plain seconds).

    Raises ValueError with a message that says what is accepted.
    """
    match = _RE.fullmatch(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: write a number with a unit, such as 30s, 1m, 5m, 1h"
        )
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds``: 30 -> ``30s``, 60 -> ``1m``, 0.5 -> ``500ms``."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    ms = seconds * 1000
    if ms.is_integer():
        return f"{int(ms)}ms"
    return f"{seconds:g}s"


def parse_ladder(text: str) -> tuple[float, ...]:
    """A retry ladder such as ``30s,1m,5m,30m``: strictly increasing, at most 10 steps."""
    steps = tuple(parse_duration(part) for part in text.split(",") if part.strip())
    if not steps:
        raise ValueError("the retry ladder is empty: give steps such as 30s,1m,5m,30m")
    if len(steps) > 10:
        raise ValueError(f"the retry ladder has {len(steps)} steps: 10 at the most")
    for before, after in itertools.pairwise(steps):
        if after <= before:
            raise ValueError(
                f"the retry ladder {text!r} must increase strictly: "
                f"{format_duration(after)} comes after {format_duration(before)}"
            )
    return steps


def epoch_ms() -> int:
    """The wall clock in epoch milliseconds (the unit of record timestamps and due times)."""
    return int(time.time() * 1000)
