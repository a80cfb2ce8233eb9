"""Admission counters, kept on the admission object and exported as Prometheus metrics."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from asynctier.platform import metrics


@dataclass
class AdmissionStats:
    """What admission held back, by binding (and tenant for quotas), since it started."""

    throttled: Counter[str] = field(default_factory=Counter)
    quota_delayed: Counter[tuple[str, str]] = field(default_factory=Counter)
    concurrency_waits: Counter[str] = field(default_factory=Counter)
    redis_fallbacks: Counter[str] = field(default_factory=Counter)

    def count_throttled(self, binding: str, n: int) -> None:
        """``n`` items waited for the rate limit."""
        self.throttled[binding] += n
        metrics.count_throttled(binding, n)

    def count_quota_delayed(self, binding: str, tenant: str, n: int) -> None:
        """``n`` items were over their tenant's quota."""
        self.quota_delayed[binding, tenant] += n
        metrics.count_quota_delayed(binding, tenant, n)

    def count_concurrency_wait(self, binding: str) -> None:
        """A chunk waited for a concurrency slot."""
        self.concurrency_waits[binding] += 1
        metrics.count_concurrency_waits(binding)

    def count_fallback(self, binding: str) -> None:
        """An admission decision was taken without Redis."""
        self.redis_fallbacks[binding] += 1
        metrics.count_redis_fallback(binding)
