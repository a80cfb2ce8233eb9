"""HTTP parameters are untrusted: each is checked here, and a bad one is refused with a
400 that says which and why."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from starlette.exceptions import HTTPException

from asynctier.platform.binding import is_binding_name

#: The largest offset Kafka has (a signed 64-bit integer).
MAX_OFFSET = 2**63 - 1
#: Free text (a reason, a piece of an error, an item id) at most this long.
MAX_TEXT = 200
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def bad(name: str, why: str) -> HTTPException:
    """The 400 refusing parameter ``name``."""
    return HTTPException(400, f"parameter {name!r}: {why}")


def binding_name(value: str) -> str:
    """A binding's name as ``asynctier bind`` allows it."""
    if not is_binding_name(value):
        raise bad("binding", "not a binding name (a-z, 0-9, _ and -, at most 63)")
    return value


def namespace(value: str) -> str:
    """A queue namespace (a tenant's name)."""
    if not _NAMESPACE_RE.fullmatch(value):
        raise bad("namespace", "not a namespace (letters, digits, _ . -, at most 63)")
    return value


def topic(value: str) -> str:
    """A queue topic's name."""
    if not _TOPIC_RE.fullmatch(value) or value in (".", ".."):
        raise bad("topic", "not a topic name (letters, digits, . _ -, at most 249)")
    return value


def integer(query: Mapping[str, str], name: str, default: int | None, low: int = 0,
            high: int = MAX_OFFSET) -> int | None:
    """An optional whole number from ``low`` to ``high``."""
    text = query.get(name, "")
    if text == "":
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise bad(name, f"{text[:40]!r} is not a whole number")
    value = int(text)
    if not low <= value <= high:
        raise bad(name, f"{value} is not from {low} to {high}")
    return value


def number(query: Mapping[str, str], name: str, low: float, high: float) -> float | None:
    """An optional number from ``low`` to ``high`` (a rate)."""
    text = query.get(name, "").strip()
    if text == "":
        return None
    try:
        value = float(text[:40])
    except ValueError:
        raise bad(name, f"{text[:40]!r} is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise bad(name, f"{text[:40]!r} is not from {low:g} to {high:g}")
    return value


def text(query: Mapping[str, str], name: str) -> str:
    """Optional free text, printable, at most :data:`MAX_TEXT` characters."""
    value = query.get(name, "")
    if len(value) > MAX_TEXT:
        raise bad(name, f"longer than {MAX_TEXT} characters")
    if not value.isprintable():
        raise bad(name, "holds control characters")
    return value


def moment(query: Mapping[str, str], name: str) -> int:
    """An optional UTC time (``YYYY-MM-DDTHH:MM``, as a datetime-local field sends it) as
    epoch ms; 0 when absent."""
    value = query.get(name, "")
    if value == "":
        return 0
    try:
        when = datetime.fromisoformat(value[:40])
    except ValueError:
        raise bad(name, f"{value[:40]!r} is not a time as YYYY-MM-DDTHH:MM (UTC)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def offsets(values: list[str], most: int = 1000) -> frozenset[int]:
    """The chosen dead letters' offsets (each a whole number; at most ``most``)."""
    if len(values) > most:
        raise bad("offset", f"{len(values)} chosen; choose at most {most}, or replay by "
                            "filter")
    return frozenset(integer({"offset": v}, "offset", 0) or 0 for v in values)
