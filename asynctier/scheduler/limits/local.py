"""The per-scheduler limiter used when Redis does not answer (policy ``fail_open``).

Each scheduler then enforces the binding's rate on its own (so N schedulers admit up to N
times the rate) and its local concurrency cap; quotas are not enforced. Limits shared
through Redis apply again by themselves as soon as Redis answers.
"""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.scheduler.limits.bucket import TokenBucket, burst_of


class LocalLimiter:
    """One in-memory token bucket per binding, kept across outages."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def reserve(self, binding: Binding, n: int) -> float:
        """Take ``n`` tokens of the binding's local bucket; the seconds to wait."""
        assert binding.limits.rate_per_s is not None
        burst = burst_of(binding)
        bucket = self._buckets.get(binding.name)
        if bucket is None:
            bucket = self._buckets[binding.name] = TokenBucket(binding.limits.rate_per_s, burst)
        elif (bucket.rate_per_s, bucket.burst) != (binding.limits.rate_per_s, burst):
            bucket.reconfigure(binding.limits.rate_per_s, burst)
        return bucket.reserve(n)
