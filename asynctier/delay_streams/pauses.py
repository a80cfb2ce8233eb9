"""When a delay topic's record may leave, and which partitions wait for their head.

A record in the delay topic of interval ``I`` leaves at its broker timestamp + ``I``
(:func:`release_at_ms`). Records of one partition are in timestamp order, so when the head
of a partition is not due, nothing behind it is: the partition is paused until the head is
due (:class:`PauseBook`), while the other partitions keep flowing. Pure code: no Kafka here.
"""

from __future__ import annotations

#: A record due at most this long after its release time is held until due rather than
#: sent through one more hop: absorbs small clock skew between the broker and this process
#: (a real remainder, such as the last 1s of 4s+2s+1s, still takes its hop).
HOLD_FOR_DUE_MS = 100


def release_at_ms(timestamp_ms: int, interval_ms: int, due_ms: int = 0) -> int:
    """Epoch ms at which a delay record may leave its topic (never before ts + interval)."""
    at = timestamp_ms + interval_ms
    if at < due_ms <= at + HOLD_FOR_DUE_MS:
        return due_ms
    return at


class PauseBook:
    """Paused partitions of one consumer and the epoch ms at which each may resume."""

    def __init__(self) -> None:
        self._resume_ms: dict[int, int] = {}

    def pause(self, partition: int, resume_ms: int) -> None:
        """Note that ``partition`` waits until ``resume_ms``."""
        self._resume_ms[partition] = resume_ms

    def is_paused(self, partition: int) -> bool:
        """True while ``partition`` waits."""
        return partition in self._resume_ms

    def take_due(self, now_ms: int) -> list[int]:
        """The partitions whose wait is over (forgotten here: the caller resumes them)."""
        due = [p for p, at in self._resume_ms.items() if at <= now_ms]
        for p in due:
            del self._resume_ms[p]
        return due

    def wait_s(self, now_ms: int, longest_s: float) -> float:
        """How long the consumer may block: until the next resume, at most ``longest_s``."""
        if not self._resume_ms:
            return longest_s
        nearest = (min(self._resume_ms.values()) - now_ms) / 1000.0
        return max(0.0, min(longest_s, nearest))

    def forget(self, partitions: list[int]) -> None:
        """Drop revoked or lost partitions."""
        for p in partitions:
            self._resume_ms.pop(p, None)

    @property
    def paused(self) -> list[int]:
        """The partitions that wait now."""
        return sorted(self._resume_ms)
