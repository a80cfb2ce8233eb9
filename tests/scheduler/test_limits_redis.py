"""RedisAdmission against the real Redis: rate, concurrency leases, quotas, adaptive limit.

Each test has its own prefix, so its own buckets, leases and quota keys. Two
RedisAdmission instances stand for two schedulers: each has its own Redis client, local
state and lease holder id, and they share only what Redis holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

import redis
from redis.asyncio import Redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.wire import Item
from asynctier.scheduler.limits import AdmissionConfig, Quota, RedisAdmission
from asynctier.scheduler.limits.quota import QuotaStore, RedisQuota
from tests.helpers import MinuteClock, wait_until

BASE = Binding(name="orders", source=Source("kafka", "orders"), function="app.jobs:handle",
               tenant="acme")


def make_items(refs: Sequence[str], start_id: int = 0) -> list[Item]:
    """Items whose source_ref are ``refs``."""
    return [{"id": start_id + i, "binding": BASE.name, "payload": b"{}", "key": None,
             "headers": [], "attempt": 1, "source_ref": ref, "record_time_ms": 0,
             "priority": 0, "deadline_ms": None}
            for i, ref in enumerate(refs)]


@contextlib.asynccontextmanager
async def admissions(settings: Settings, n: int, config: AdmissionConfig | None = None,
                     clock: Callable[[], int] | None = None,
                     ) -> AsyncIterator[list[RedisAdmission]]:
    made = [RedisAdmission(settings, config, clock=clock) for _ in range(n)]
    try:
        yield made
    finally:
        for admission in made:
            await admission.close()


# -- rate ---------------------------------------------------------------------------------


def test_rate_200_per_s_over_3000_items_with_two_schedulers(
        settings: Settings, redis_client: redis.Redis) -> None:
    # burst: one second's worth (200)
    binding = BASE.with_changes(limits=replace(BASE.limits, rate_per_s=200.0))
    total, chunk = 3000, 25
    granted: list[tuple[float, int]] = []

    async def scheduler(admission: RedisAdmission, left: list[int]) -> None:
        while left[0] > 0:
            left[0] -= chunk
            await admission.take_tokens(binding, chunk)
            granted.append((time.monotonic(), chunk))

    async def scenario() -> float:
        left = [total]
        async with admissions(settings, 2) as (a, b):
            start = time.monotonic()
            await asyncio.gather(*(scheduler(x, left) for x in (a, b) for _ in range(4)))
            assert a.stats.throttled[binding.name] > 0 and b.stats.throttled[binding.name] > 0
            return start

    start = asyncio.run(scenario())
    assert sum(n for _, n in granted) == total
    elapsed = max(t for t, _ in granted) - start
    overall = total / elapsed
    steady = (total - 200) / elapsed  # the first second's burst is free
    print(f"\nrate: {total} items in {elapsed:.2f} s with 2 schedulers x 4 tasks: "
          f"{overall:.1f}/s overall, {steady:.1f}/s after the burst (limit 200/s)")
    assert 180 <= overall <= 220
    assert 180 <= steady <= 220


def test_a_take_larger_than_the_burst_waits_in_one_round_trip(settings: Settings,
                                                             redis_client: redis.Redis) -> None:
    binding = BASE.with_changes(limits=replace(BASE.limits, rate_per_s=100.0, burst=10))

    async def scenario() -> float:
        async with admissions(settings, 1) as (a,):
            await a.take_tokens(binding, 1)  # load the script
            start = time.monotonic()
            await a.take_tokens(binding, 59)  # 9 left in the bucket: 50 to refill
            return time.monotonic() - start

    elapsed = asyncio.run(scenario())
    assert 0.45 <= elapsed <= 0.7, elapsed


def test_a_fast_binding_that_takes_spare_tokens_ahead_never_exceeds_its_rate(
        settings: Settings, redis_client: redis.Redis) -> None:
    # 20,000/s with a burst of 2,000: a take asks for 50 ms (1,000 tokens) of spare, granted
    # only from what the bucket holds. Two schedulers x 4 tasks take 50 at a time for 1.5 s,
    # faster than the rate: the limit binds.
    binding = BASE.with_changes(limits=replace(BASE.limits, rate_per_s=20_000.0, burst=2_000))
    chunk, seconds = 50, 1.5
    granted: list[tuple[float, int]] = []
    calls_before = _script_calls(redis_client)

    async def scheduler(admission: RedisAdmission, until: float) -> None:
        while time.monotonic() < until:
            await admission.take_tokens(binding, chunk)
            granted.append((time.monotonic(), chunk))

    async def scenario() -> float:
        async with admissions(settings, 2) as (a, b):
            start = time.monotonic()
            await asyncio.gather(*(scheduler(x, start + seconds) for x in (a, b)
                                   for _ in range(4)))
            return start

    start = asyncio.run(scenario())
    calls = _script_calls(redis_client) - calls_before
    taken = sum(n for _, n in granted)
    elapsed = max(t for t, _ in granted) - start
    print(f"\nbinding: {len(granted)} takes, {calls} script calls, {taken} tokens in "
          f"{elapsed:.2f} s (limit {2_000 + 20_000 * elapsed:.0f})")
    # never more than the burst plus the rate over the time (tokens come from the bucket)
    assert taken <= 2_000 + 20_000 * elapsed
    # and close to it: the limit binds here, spare tokens are not lost in bulk
    assert taken >= 0.8 * 20_000 * elapsed


def test_a_never_binding_limit_serves_most_takes_without_a_round_trip(
        settings: Settings, redis_client: redis.Redis) -> None:
    # spare: 50,000 tokens a take
    binding = BASE.with_changes(limits=replace(BASE.limits, rate_per_s=1_000_000.0))
    calls_before = _script_calls(redis_client)

    async def scenario() -> int:
        async with admissions(settings, 2) as (a, b):
            for _ in range(100):
                for admission in (a, b):
                    await admission.take_tokens(binding, 1000)
            assert not a.stats.throttled and not b.stats.throttled
        return 200

    takes = asyncio.run(scenario())
    calls = _script_calls(redis_client) - calls_before
    print(f"\nnever binding: {takes} takes of 1,000, {calls} script calls")
    assert calls <= takes / 10, (calls, takes)


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha",
                                                                     "cmdstat_eval"))


def test_unlimited_binding_takes_no_tokens(settings: Settings) -> None:
    async def scenario() -> None:
        async with admissions(settings, 1) as (a,):
            for _ in range(100):
                await a.take_tokens(BASE, 10_000)
            assert not a.stats.throttled

    asyncio.run(scenario())


# -- concurrency --------------------------------------------------------------------------


def test_concurrency_cap_4_holds_across_two_schedulers(settings: Settings,
                                                       redis_client: redis.Redis) -> None:
    binding = BASE.with_changes(limits=replace(BASE.limits, max_concurrency=4))
    inside, peak, done = [0], [0], [0]

    async def run(admission: RedisAdmission) -> None:
        async with admission.slot(binding):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            await asyncio.sleep(0.01)
            inside[0] -= 1
            done[0] += 1

    async def scenario() -> tuple[int, int]:
        async with admissions(settings, 2) as (a, b):
            await asyncio.gather(*(run(x) for x in (a, b) for _ in range(60)))
            waits = a.stats.concurrency_waits[binding.name] + b.stats.concurrency_waits[
                binding.name]
            return waits, await Redis.from_url(settings.redis_url).zcard(
                settings.names.redis_key("leases", binding.name))

    start = time.monotonic()
    waits, left = asyncio.run(scenario())
    elapsed = time.monotonic() - start
    print(f"\nconcurrency: 120 items of 10 ms under cap 4 on 2 schedulers: peak {peak[0]}, "
          f"{elapsed:.2f} s (ideal {120 * 0.01 / 4:.2f} s), {waits} waits")
    assert done[0] == 120
    assert peak[0] == 4
    assert waits > 0
    assert left == 0  # every lease given back


async def hold(admission: RedisAdmission, binding: Binding, got: asyncio.Event,
               release: asyncio.Event) -> None:
    """Hold a slot of ``binding`` from when ``got`` is set until ``release`` is."""
    async with admission.slot(binding):
        got.set()
        await release.wait()


async def settles(event: asyncio.Event, timeout_s: float) -> bool:
    """True when ``event`` is set within ``timeout_s``."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


HOLDER = textwrap.dedent("""
    import asyncio, contextlib, sys
    from asynctier.platform.binding import Binding
    from asynctier.platform.binding_features import Limits, Source
    from asynctier.platform.config import Settings
    from asynctier.scheduler.limits import AdmissionConfig, RedisAdmission

    async def main():
        settings = Settings(redis_url=sys.argv[1], prefix=sys.argv[2])
        binding = Binding("orders", Source("kafka", "orders"), "app.jobs:handle",
                          limits=Limits(max_concurrency=4))
        admission = RedisAdmission(settings, AdmissionConfig(lease_s=float(sys.argv[3])))
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(4):
                await stack.enter_async_context(admission.slot(binding))
            print("held", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
""")


def test_leases_of_a_scheduler_killed_with_sigkill_expire_and_the_cap_holds_again(
        settings: Settings, redis_client: redis.Redis) -> None:
    lease_s = 2.0
    binding = BASE.with_changes(limits=replace(BASE.limits, max_concurrency=4))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, settings.redis_url, settings.prefix, str(lease_s)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"

        async def scenario() -> float:
            async with admissions(settings, 1, AdmissionConfig(lease_s=lease_s)) as (a,):
                release = asyncio.Event()
                got = [asyncio.Event() for _ in range(5)]
                # The holder's heartbeat keeps its 4 leases past their lease time.
                tasks = [asyncio.create_task(hold(a, binding, got[0], release))]
                assert not await settles(got[0], lease_s * 1.5), "5th slot while 4 held"
                killed = time.monotonic()
                holder.send_signal(signal.SIGKILL)
                holder.wait(10)
                tasks += [asyncio.create_task(hold(a, binding, g, release)) for g in got[1:]]
                for event in got[:4]:
                    assert await settles(event, lease_s + 2.0), "the leases did not expire"
                freed_after = time.monotonic() - killed
                assert not await settles(got[4], 1.0), "the cap of 4 does not hold again"
                release.set()
                await asyncio.gather(*tasks)
                return freed_after

        freed_after = asyncio.run(scenario())
        print(f"\nleases of the SIGKILLed holder came back {freed_after:.2f} s after the kill "
              f"(lease time {lease_s:g} s)")
        assert freed_after <= lease_s + 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_failures_shrink_the_local_limit_and_successes_grow_it_back(
        settings: Settings, redis_client: redis.Redis) -> None:
    binding = BASE.with_changes(limits=replace(BASE.limits, max_concurrency=8))
    inside, peak = [0], [0]

    async def run(admission: RedisAdmission) -> None:
        async with admission.slot(binding):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            await asyncio.sleep(0.005)
            inside[0] -= 1

    async def scenario() -> None:
        async with admissions(settings, 1) as (a,):
            assert a.concurrency_limit(binding) == 8
            for _ in range(2):
                a.report(binding, ok=0, failed=64)
            assert a.concurrency_limit(binding) == 2
            await asyncio.gather(*(run(a) for _ in range(40)))
            assert peak[0] == 2  # held back, not failed: every item ran
            for _ in range(6):
                a.report(binding, ok=64, failed=0)
            assert a.concurrency_limit(binding) == 8

    asyncio.run(scenario())


# -- quotas -------------------------------------------------------------------------------


def test_quota_500_per_minute_delays_from_the_501st_and_never_charges_twice(
        settings: Settings, redis_client: redis.Redis) -> None:
    binding = BASE
    refs = [f"orders/0/{offset}" for offset in range(700)]
    clock = MinuteClock(1_000)  # one minute for the whole test, whatever the real time

    async def scenario() -> tuple[dict[int, float], dict[int, float], int]:
        async with admissions(settings, 2, clock=clock) as (a, b):
            store = a.quotas
            await store.set("acme", Quota(per_minute=500, per_day=100_000))
            over: dict[int, float] = {}
            for i in range(0, 600, 256):  # chunks of 256, alternating schedulers
                chunk = make_items(refs[i:min(i + 256, 600)], start_id=i)
                over.update(await (a if i % 512 == 0 else b).over_quota(binding, chunk))
            # The same records again (a tailer re-read them after a crash) and 100 new ones.
            again: dict[int, float] = {}
            for i in range(0, 700, 256):
                chunk = make_items(refs[i:min(i + 256, 700)], start_id=i)
                again.update(await b.over_quota(binding, chunk))
            used = (await store.usage("acme")).minute
            assert a.stats.quota_delayed[binding.name, "acme"] > 0
            return over, again, used

    over, again, used = asyncio.run(scenario())
    assert sorted(over) == list(range(500, 600))
    assert all(0 < delay <= 60 for delay in over.values())
    assert used == 500, "re-submitted records were charged again"
    assert sorted(again) == list(range(500, 700))
    print(f"\nquota: 600 items at 500/min: {len(over)} delayed by "
          f"{min(over.values()):.1f}-{max(over.values()):.1f} s; re-submitted: usage stays {used}")


def test_per_day_quota_delays_until_the_next_utc_day(settings: Settings,
                                                     redis_client: redis.Redis) -> None:
    async def scenario() -> dict[int, float]:
        async with admissions(settings, 1) as (a,):
            await a.quotas.set("acme", Quota(per_day=3))
            # r0 twice in one chunk (a duplicate delivery) is charged once.
            return await a.over_quota(BASE, make_items(["r0", "r0", "r1", "r2", "r3", "r4"]))

    over = asyncio.run(scenario())
    now = redis_client.time()[0]
    assert sorted(over) == [4, 5]
    assert all(abs(d - (86400 - now % 86400)) < 5 for d in over.values())


def test_charges_live_in_window_hashes_and_a_clock_windows_off_charges_once(
        settings: Settings, redis_client: redis.Redis) -> None:
    """What was charged is a field of the binding's hash of the current charge window
    (the script is given the hashes as KEYS): free again in the next window, charged anew
    after that. A scheduler whose clock is ten windows off learns Redis' window."""
    pattern = f"{settings.prefix}:{{tenant:acme}}:charges:orders:*"

    def window() -> int:
        return int(redis_client.time()[0])

    async def scenario() -> tuple[list[int], int]:
        client = Redis.from_url(settings.redis_url)
        quota = RedisQuota(client, settings.names, charge_ttl_s=1,
                           wall=lambda: time.time() + 10)
        store = QuotaStore(client, settings.names)
        items = make_items(["orders/0/1", "orders/0/2"])
        used = []
        try:
            await store.set("acme", Quota(per_day=1000))
            start = window()
            for wanted in (start + 1, start + 2, start + 4):
                wait_until(lambda w=wanted: window() >= w, 10, f"Redis second {wanted}")
                assert await quota.charge(BASE, items) == {}
                assert await quota.charge(BASE, items) == {}  # the same records again
                used.append((await store.usage("acme")).day)
            return used, quota._skew
        finally:
            await client.aclose()

    used, skew = asyncio.run(scenario())
    assert used == [2, 2, 4]  # charged, free in the next window, charged two windows on
    assert skew in (-10, -11, -9)
    hashes = list(redis_client.scan_iter(match=pattern))
    assert hashes and all(redis_client.type(k) == b"hash" for k in hashes)
    assert all(0 < redis_client.pttl(k) <= 2000 for k in hashes)


def test_a_tenant_without_quota_is_never_charged(settings: Settings,
                                                 redis_client: redis.Redis) -> None:
    async def scenario() -> dict[int, float]:
        async with admissions(settings, 1) as (a,):
            return await a.over_quota(BASE, make_items([f"r{i}" for i in range(300)]))

    assert asyncio.run(scenario()) == {}
    assert list(redis_client.scan_iter(match=f"{settings.prefix}:*")) == []


def test_a_quota_set_later_applies_within_the_recheck_time(settings: Settings,
                                                           redis_client: redis.Redis) -> None:
    config = AdmissionConfig(quota_recheck_s=0.5)

    async def scenario() -> float:
        async with admissions(settings, 1, config) as (a,):
            assert await a.over_quota(BASE, make_items(["a", "b"])) == {}
            await a.quotas.set("acme", Quota(per_minute=1))
            set_at = time.monotonic()
            n = 0
            while not await a.over_quota(BASE, make_items([f"later{n}", f"later{n}b"])):
                n += 1
                assert time.monotonic() - set_at < 3, "the new quota never applied"
                await asyncio.sleep(0.05)
            return time.monotonic() - set_at

    assert asyncio.run(scenario()) <= 0.5 + 0.3
