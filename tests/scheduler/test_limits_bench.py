"""What admission costs per chunk when it is on but never binding, against OpenAdmission.

Counts Redis round trips with a client that counts its commands (one per round trip: no
pipelines here) and prints the time per chunk of 256 items. Run with ``-s`` to see it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, cast

import redis
from redis.asyncio import Redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Limits, Source
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from asynctier.scheduler.admission import Admission, OpenAdmission
from asynctier.scheduler.limits import Quota, RedisAdmission

CHUNK = 256
CHUNKS = 150


class CountingRedis(Redis):
    """A real client that counts the commands it sends."""

    calls = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.calls += 1
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def chunk_of(binding: Binding, n: int) -> list[Item]:
    return [{"id": i, "binding": binding.name, "payload": b"{}", "key": None, "headers": [],
             "attempt": 1, "source_ref": f"{binding.name}/{n}/{i}", "record_time_ms": 0,
             "priority": 0, "deadline_ms": None}
            for i in range(CHUNK)]


async def per_chunk_s(admission: Admission, binding: Binding) -> tuple[float, float]:
    """Wall and CPU seconds (this process) per chunk for over_quota + take_tokens."""
    chunks = [chunk_of(binding, n) for n in range(CHUNKS)]
    wall, cpu = time.perf_counter(), time.process_time()
    for chunk in chunks:
        assert not await admission.over_quota(binding, chunk)
        await admission.take_tokens(binding, CHUNK)
    return (time.perf_counter() - wall) / CHUNKS, (time.process_time() - cpu) / CHUNKS


def test_admission_costs_at_most_one_round_trip_per_step_per_chunk(settings: Settings,
                                                           redis_client: redis.Redis) -> None:
    charged = Binding(name="charged", source=Source("kafka", "t"), function="m:f", tenant="acme",
                      limits=Limits(rate_per_s=1_000_000.0))
    free = charged.with_changes(name="free", tenant="nobody")
    capped = charged.with_changes(name="capped",
                                  limits=replace(charged.limits, max_concurrency=1000))
    metered = charged.with_changes(name="metered",  # spare: 50 < 100
                                   limits=replace(charged.limits, rate_per_s=1000.0))
    counts: dict[str, int] = {}

    async def scenario() -> dict[str, tuple[float, float]]:
        client = cast(CountingRedis, CountingRedis.from_url(settings.redis_url))
        admission = RedisAdmission(settings, client=client)
        try:
            await admission.quotas.set("acme", Quota(per_minute=10**9, per_day=10**9))
            # spare tokens last 50 ms: a frozen clock keeps a loaded machine from
            # letting them lapse between these steps (it is not what is counted)
            admission._bucket._clock = lambda: 0.0
            for binding in (charged, free, metered):  # load the scripts
                await admission.over_quota(binding, chunk_of(binding, -1))
                await admission.take_tokens(binding, 1)
            await admission.over_quota(charged, chunk_of(charged, -4))  # the quota's own
            before = client.calls
            await admission.over_quota(charged, chunk_of(charged, -2))
            assert client.calls - before == 1
            await admission.take_tokens(charged, CHUNK)
            assert client.calls - before == 1  # from the spare tokens of the first take
            await admission.over_quota(free, chunk_of(free, -2))
            assert client.calls - before == 1  # a tenant known to have no quota: none
            admission._bucket._clock = time.monotonic
            # A binding too slow for spare tokens: its quota and its tokens are one call
            # per chunk (two before they were combined).
            before = client.calls
            await admission.over_quota(metered, chunk_of(metered, -3))
            await admission.take_tokens(metered, CHUNK)
            counts["quota+tokens, no spare"] = client.calls - before
            assert counts["quota+tokens, no spare"] == 1
            async with admission.slot(capped):
                pass
            before = client.calls
            async with admission.slot(capped):
                assert client.calls - before == 1
            counts["slot of a capped binding, per item"] = client.calls - before
            assert counts["slot of a capped binding, per item"] == 2  # take, give back
            times = {"open": await per_chunk_s(OpenAdmission(), charged),
                     "quota+rate": await per_chunk_s(admission, charged),
                     "rate, tenant without quota": await per_chunk_s(admission, free)}
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(CHUNKS):
                async with admission.slot(capped):
                    pass
            times["slot (lease+release)"] = ((time.perf_counter() - wall) / CHUNKS,
                                             (time.process_time() - cpu) / CHUNKS)
            assert not admission.stats.throttled
            return times
        finally:
            await admission.close()
            await client.aclose()

    times = asyncio.run(scenario())
    print("\nRedis round trips:", ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"\nadmission per chunk of {CHUNK} items ({CHUNKS} chunks, one process, local Redis):")
    for name, (wall, cpu) in times.items():
        print(f"  {name:<28} wall {wall * 1e6:7.0f} us/chunk ({wall * 1e6 / CHUNK:5.2f} us/item)"
              f"  cpu here {cpu * 1e6:7.0f} us/chunk ({cpu * 1e6 / CHUNK:5.2f} us/item)")
    assert times["quota+rate"][0] < 0.02  # generous: a loaded CI machine
