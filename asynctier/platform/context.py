"""The ``ctx`` argument every function receives."""

from __future__ import annotations


class Context:
    """What a function may know about the record it runs on.

    ``binding`` and ``tenant`` name the binding; ``key`` and ``headers`` are the record's
    (a header value may be None); ``source`` is the record's position as text
    (``topic/partition/offset`` for Kafka); ``attempt`` counts from 1; ``record_time`` and
    ``deadline`` are epoch seconds (the function should be done by ``deadline``).

    A plain class with slots, not a dataclass: one is built per item on the hot path.
    """

    __slots__ = ("attempt", "binding", "deadline", "headers", "key", "record_time", "source",
                 "tenant")

    def __init__(self, binding: str, key: bytes | None,
                 headers: tuple[tuple[str, bytes | None], ...], source: str, attempt: int,
                 record_time: float, deadline: float, tenant: str = "default") -> None:
        self.binding = binding
        self.key = key
        self.headers = headers
        self.source = source
        self.attempt = attempt
        self.record_time = record_time
        self.deadline = deadline
        self.tenant = tenant

    def header(self, name: str) -> bytes | None:
        """The value of the first header called ``name`` (None when absent)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __repr__(self) -> str:
        return (f"Context(binding={self.binding!r}, source={self.source!r}, "
                f"attempt={self.attempt}, key={self.key!r})")
