"""The one generic call between any tailer and the scheduler: ``submit(items) -> outcomes``.

A batch travels as one message, encoded with fastavro from ``schemas/submit.avsc`` and
``schemas/outcomes.avsc``. Items and outcomes are plain dicts (TypedDicts) because the
hot path builds and reads thousands of them a second; no Kafka type crosses this line and
``source_ref`` is opaque to the scheduler.
"""

from __future__ import annotations

import io
from typing import Any, Literal, TypedDict

import fastavro

from asynctier.platform.schemas import load_schema

Status = Literal["ok", "retry", "failed"]


class Header(TypedDict):
    """A record header."""

    name: str
    value: bytes | None


class Item(TypedDict):
    """One unit of work: a record of some source, for one binding."""

    id: int
    binding: str
    payload: bytes | None
    key: bytes | None
    headers: list[Header]
    attempt: int
    source_ref: str
    record_time_ms: int


class Outcome(TypedDict):
    """What became of one item: ``ok``, ``retry`` (after ``after_s``) or ``failed``.

    ``spends_attempt`` is false for a retry the scheduler chose (over quota, held back by
    downstream protection): the record comes back with the same attempt number.
    """

    id: int
    status: Status
    after_s: float | None
    error: str | None
    spends_attempt: bool


def ok(item_id: int) -> Outcome:
    """A success."""
    return {"id": item_id, "status": "ok", "after_s": None, "error": None,
            "spends_attempt": True}


def retry(item_id: int, error: str, after_s: float | None = None,
          spends_attempt: bool = True) -> Outcome:
    """Run again later; ``after_s=None`` follows the binding's ladder."""
    return {"id": item_id, "status": "retry", "after_s": after_s, "error": error,
            "spends_attempt": spends_attempt}


def failed(item_id: int, error: str) -> Outcome:
    """Failed for good: a dead letter."""
    return {"id": item_id, "status": "failed", "after_s": None, "error": error,
            "spends_attempt": True}


def encode_items(items: list[Item]) -> bytes:
    """One submit request as bytes."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("submit"), {"items": items})
    return buf.getvalue()


def decode_items(data: bytes) -> list[Item]:
    """The items of one submit request."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("submit"), None)
    items: list[Item] = doc["items"]
    return items


def encode_outcomes(outcomes: list[Outcome]) -> bytes:
    """One submit response as bytes."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("outcomes"), {"outcomes": outcomes})
    return buf.getvalue()


def decode_outcomes(data: bytes) -> list[Outcome]:
    """The outcomes of one submit response."""
    doc: Any = fastavro.schemaless_reader(io.BytesIO(data), load_schema("outcomes"), None)
    outcomes: list[Outcome] = doc["outcomes"]
    return outcomes
