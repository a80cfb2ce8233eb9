"""Length-prefixed frames: how the scheduler and its worker processes talk over pipes."""

from __future__ import annotations

from typing import IO

#: Bytes of a frame's length prefix (big-endian).
LENGTH_BYTES = 4
#: First byte of a worker's checkpoint frame: the byte, the kind (``json`` or ``bytes``),
#: a newline, the state. The scheduler answers with an empty frame (durable) or the
#: reason it was not saved.
CHECKPOINT = b"\x01"


def frame(data: bytes) -> bytes:
    """``data`` with its length prefix."""
    return len(data).to_bytes(LENGTH_BYTES, "big") + data


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One frame, or None at the end of the stream."""
    head = stream.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        return None
    size = int.from_bytes(head, "big")
    body = stream.read(size)
    return body if len(body) == size else None
