"""Values read from Redis that are no such value: refused where read, said once each.

Anything may write to Redis (a script, a hand at ``redis-cli``), so every value the
admission reads there is checked where it is read: in the Lua script that reads it (the
script answers what it refused) or in Python. A refused value never stops a loop or a
task: the last good value or a safe default applies instead, and the operator is told once
per bad value (not once per call) which key holds it and which command fixes it.
"""

from __future__ import annotations

import logging
from typing import Final

log = logging.getLogger(__name__)

#: Bad values remembered as said; past this many the memory starts afresh (a value is
#: then said once more), so that a flood of distinct bad values cannot grow it for ever.
MAX_REMEMBERED: Final = 10_000
#: A bad value is quoted in the log up to this many characters.
QUOTED_CHARS: Final = 40


def quoted(value: object) -> str:
    """A value read from Redis as a short quoted text for the log."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return repr(text[:QUOTED_CHARS])


class BadValues:
    """Says each bad value once: ``refused(key, field, value, ...)`` logs the first time a
    value is seen at that key and field, and not again until another value was seen."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or log
        self._said: dict[tuple[str, str], str] = {}

    def refused(self, key: str, field: str, value: object, why: str, fix: str,
                **extra: str) -> bool:
        """Log ``value`` of ``key``'s ``field`` as refused (``why``; ``fix``: the command
        that fixes it) unless it was said already; True when it was logged now."""
        text = quoted(value)
        if self._said.get((key, field)) == text:
            return False
        if len(self._said) >= MAX_REMEMBERED:
            self._said.clear()
        self._said[(key, field)] = text
        where = f"{field} of {key}" if field else key
        self._log.error("a bad value in Redis: %s is %s, %s; %s", where, text, why, fix,
                        extra=extra)
        return True

    def good(self, key: str, field: str = "") -> None:
        """``key``'s ``field`` holds a good value again: a bad one later is said again."""
        self._said.pop((key, field), None)
