"""The console's own lag and throughput samples: no Prometheus needed for the last hours.

Each sample of a binding holds its lag (records and seconds) and how far its group has
committed (the sum over partitions); throughput is the committed offsets gained between
two samples over the time between them. Samples older than ``keep_s`` are dropped, so
memory stays bounded by ``keep_s / every_s`` samples per binding.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True)
class Sample:
    """One binding at one time (epoch seconds)."""

    at_s: float
    lag: int
    lag_s: float | None
    #: The sum of the group's committed offsets; None for a queue binding.
    done: int | None


class History:
    """Samples per binding, oldest first, for ``keep_s`` seconds."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()

    def add(self, binding: str, sample: Sample) -> None:
        """Keep ``sample``; drop what is older than ``keep_s`` before it."""
        with self._lock:
            kept = self._samples.setdefault(binding, deque())
            kept.append(sample)
            while kept and kept[0].at_s < sample.at_s - self.keep_s:
                kept.popleft()

    def forget_others(self, bindings: set[str]) -> None:
        """Drop the samples of bindings that no longer exist."""
        with self._lock:
            for name in set(self._samples) - bindings:
                del self._samples[name]

    def of(self, binding: str) -> list[Sample]:
        """The samples of ``binding``, oldest first."""
        with self._lock:
            return list(self._samples.get(binding, ()))

    def throughput(self, binding: str) -> float | None:
        """Records a second between the last two samples (None until there are two)."""
        samples = self.of(binding)
        return rates(samples[-2:])[-1] if len(samples) >= 2 else None


def rates(samples: list[Sample]) -> list[float | None]:
    """Records a second between each sample and the one before it (None for the first,
    for a queue binding, and when the group moved back)."""
    out: list[float | None] = [None]
    for before, after in pairwise(samples):
        dt = after.at_s - before.at_s
        if before.done is None or after.done is None or dt <= 0 or after.done < before.done:
            out.append(None)
        else:
            out.append((after.done - before.done) / dt)
    return out


def polyline(values: list[float | None], width: int, height: int) -> str:
    """SVG polyline points of ``values`` scaled into ``width`` x ``height`` (top: the
    largest value); unknown values are left out."""
    known = [v for v in values if v is not None]
    if not known or len(values) < 2:
        return ""
    top = max(known) or 1.0
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - v / top * height:.1f}"
                    for i, v in enumerate(values) if v is not None)
