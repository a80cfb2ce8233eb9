"""The ``ctx`` argument every function receives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Context:
    """What a function may know about the record it runs on.

    ``source`` is the record's position as text (``topic/partition/offset`` for Kafka),
    ``record_time`` and ``deadline`` are epoch seconds.
    """

    binding: str
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    source: str
    attempt: int
    record_time: float
    deadline: float
    tenant: str = "default"
