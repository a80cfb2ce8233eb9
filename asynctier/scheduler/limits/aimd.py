"""Adaptive downstream protection: additive increase, multiplicative decrease (AIMD).

The dispatcher reports each chunk's successes and failures. Every ``window`` outcomes the
limit is decided once: when failures reached ``failure_ratio`` of them it is multiplied by
``decrease`` (a spike halves it), otherwise it grows by ``increase`` (one more slot), always
between ``floor`` and ``ceiling``. One decision per window (not per failure) keeps a burst
of failures of items already running from collapsing the limit at once, as TCP decreases
once per round trip.

Pure logic, no clock and no I/O: items held back by the limit simply wait for a slot and
spend no attempts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AimdConfig:
    """How the adaptive limit moves."""

    floor: int = 1
    decrease: float = 0.5
    increase: float = 1.0
    failure_ratio: float = 0.25
    window: int = 16
    #: The ceiling of a binding without a concurrency cap.
    uncapped_ceiling: int = 256

    def __post_init__(self) -> None:
        if self.floor < 1 or not 0 < self.decrease < 1 or self.increase <= 0:
            raise ValueError("AIMD needs floor >= 1, 0 < decrease < 1 and increase > 0")
        if not 0 < self.failure_ratio <= 1 or self.window < 1:
            raise ValueError("AIMD needs 0 < failure_ratio <= 1 and window >= 1")


class Aimd:
    """One binding's adaptive concurrency limit, between ``config.floor`` and ``ceiling``."""

    def __init__(self, ceiling: int, config: AimdConfig | None = None) -> None:
        self.config = config or AimdConfig()
        self.ceiling = max(ceiling, self.config.floor)
        self.limit = float(self.ceiling)
        self._ok = 0
        self._failed = 0

    @property
    def current(self) -> int:
        """The limit as a number of slots."""
        return max(self.config.floor, int(self.limit))

    @property
    def at_ceiling(self) -> bool:
        """True when nothing is held back by the adaptive limit."""
        return self.limit >= self.ceiling

    def record(self, ok: int, failed: int) -> int:
        """Count a chunk's outcomes; decide once a window is full. Returns :attr:`current`."""
        self._ok += max(0, ok)
        self._failed += max(0, failed)
        total = self._ok + self._failed
        if total >= self.config.window:
            self._decide(self._failed >= self.config.failure_ratio * total)
            self._ok = self._failed = 0
        return self.current

    def resize(self, ceiling: int) -> None:
        """Take a new ceiling (the binding's cap changed); the limit stays below it."""
        self.ceiling = max(ceiling, self.config.floor)
        self.limit = min(self.limit, float(self.ceiling))

    def _decide(self, spike: bool) -> None:
        if spike:
            self.limit = max(float(self.config.floor), self.limit * self.config.decrease)
        else:
            self.limit = min(float(self.ceiling), self.limit + self.config.increase)
