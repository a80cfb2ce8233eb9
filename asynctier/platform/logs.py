"""Logging set-up: one line per event, text for people or JSON for machines.

A line about a record carries the binding and the record's position. Pass them as
``extra=`` fields, or log through a :class:`ContextLogger` that carries them::

    log = context_logger(__name__, binding="orders", topic="orders", partition=3)
    log.warning("function failed, retrying in %s", "30s", extra={"offset": 42})

Text lines end with the context (``[binding=orders at=orders/3@42]``); JSON lines carry
each field as its own key.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

_STD = set(vars(logging.makeLogRecord({})))

#: Context fields shown at the end of a text line, in this order (when present).
CONTEXT_FIELDS = ("binding", "tenant", "group", "attempt", "batch", "items", "trace")
_POSITION = ("topic", "partition", "offset")


def context_text(record: logging.LogRecord) -> str:
    """The record's context as ``binding=orders at=orders/3@42`` (empty when none)."""
    fields = vars(record)
    parts = [f"{name}={fields[name]}" for name in CONTEXT_FIELDS
             if fields.get(name) is not None]
    topic, partition, offset = (fields.get(name) for name in _POSITION)
    if topic is not None:
        at = str(topic)
        if partition is not None:
            at += f"/{partition}"
            if offset is not None:
                at += f"@{offset}"
        parts.append(f"at={at}")
    return " ".join(parts)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL logger: message [binding=... at=topic/partition@offset]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        context = context_text(record)
        return f"{line} [{context}]" if context else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields (binding, topic, partition...) included."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD and not key.startswith("_"):
                plain = value is None or isinstance(value, (int, float, str, bool))
                doc[key] = value if plain else str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


#: A line repeated by a library (psycopg's pool says "error connecting" at every attempt
#: while a database is down) is let through once per this many seconds.
REPEAT_EVERY_S = 60.0


class RepeatFilter(logging.Filter):
    """Lets a given message through once per ``every_s`` (``clock``: monotonic seconds)."""

    def __init__(self, every_s: float = REPEAT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._said: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True the first time a message is seen, and again ``every_s`` later."""
        text, now = record.getMessage(), self.clock()
        if now - self._said.get(text, -self.every_s) < self.every_s:
            return False
        if len(self._said) > 1000:
            self._said.clear()
        self._said[text] = now
        return True


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger once for a process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    pool = logging.getLogger("psycopg.pool")
    pool.filters[:] = [RepeatFilter()]


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose lines carry fixed context (binding, topic, partition...).

    ``extra=`` given to one call is merged over the fixed context; :meth:`bind` returns a
    logger with more context (for example one per partition, then per record).
    """

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any,
                                                                         MutableMapping[str, Any]]:
        """Merge the fixed context under the call's own ``extra``."""
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    def bind(self, **fields: Any) -> ContextLogger:
        """A logger with ``fields`` added to this one's context."""
        return ContextLogger(self.logger, {**(self.extra or {}), **fields})


def context_logger(name: str | logging.Logger, **fields: Any) -> ContextLogger:
    """A :class:`ContextLogger` on logger ``name`` with ``fields`` as its context."""
    logger = logging.getLogger(name) if isinstance(name, str) else name
    return ContextLogger(logger, fields)


def position(topic: str, partition: int, offset: int | None = None) -> Mapping[str, Any]:
    """``extra=`` fields naming a record's (or a partition's) position."""
    return {"topic": topic, "partition": partition, "offset": offset}
