"""Admission controls backed by Redis: rate limits, quotas, concurrency caps, adaptive
protection and the fallback when Redis is down.

One module per concept, the algorithm apart from its storage (after dramatiq's
``rate_limits``):

- :mod:`.scripts` the Lua scripts (token bucket, quota charge, leases);
- :mod:`.bucket` token buckets (in memory and in Redis);
- :mod:`.quota` tenant quotas per minute and per day, charged once per record;
- :mod:`.concurrency` the local limit and the global leases;
- :mod:`.aimd` adaptive concurrency (additive increase, multiplicative decrease);
- :mod:`.local` the per-scheduler limiter used when Redis is down;
- :mod:`.outage` what a Redis outage is and how it is told;
- :mod:`.link` the client, outages and fallback shared by the admission and the guard;
- :mod:`.redis_admission` :class:`RedisAdmission`, which composes them for the scheduler;
- :mod:`.once` and :mod:`.redis_guard` :class:`RedisGuard`, the run-once guard (a
  delivery guarantee beside admission, not a part of it).
"""

from asynctier.scheduler.limits.aimd import Aimd, AimdConfig
from asynctier.scheduler.limits.quota import Quota, QuotaStore
from asynctier.scheduler.limits.redis_admission import AdmissionConfig, RedisAdmission
from asynctier.scheduler.limits.redis_guard import RedisGuard

__all__ = ["AdmissionConfig", "Aimd", "AimdConfig", "Quota", "QuotaStore", "RedisAdmission",
           "RedisGuard"]
