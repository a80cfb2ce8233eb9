"""A tenant weight that is no weight (``abc``, 0, -1, NaN, inf), written straight into
Redis where only ``asynctier tenant set`` (0.01 to 1000) should write: the scheduler
refuses it, logs the key and the fix, keeps the tenant's last good weight, and keeps
serving every tenant, the refused one too, alone in its tier or not. (Before, ``abc``
ended the follower for good and 0, -1 or NaN made the fair queue spin on the event loop.)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import grpc
import pytest
import redis

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.replies import read_outcomes
from asynctier.platform.rpc import SUBMIT
from asynctier.platform.wire import Columns
from asynctier.scheduler.limits.tenants import TenantStore
from tests.helpers import wait_until
from tests.scheduler_harness import Running, running_scheduler

BAD = ["abc", "0", "-1", "NaN", "inf"]


@pytest.fixture(scope="module")
def module_settings(kafka_bootstrap: str, redis_url: str) -> Settings:
    return Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                    prefix="t" + uuid.uuid4().hex[:10])


def _tenant(raw: str) -> str:
    return f"t{BAD.index(raw)}"


@pytest.fixture(scope="module")
def scheduler(module_settings: Settings) -> Iterator[Running]:
    bindings = [Binding(_tenant(raw), Source("kafka", "unused"), "tests.funcs.basic:noop",
                        tenant=_tenant(raw), execution=Execution(idempotent=True)) for raw in BAD]
    bindings.append(Binding("other", Source("kafka", "unused"), "tests.funcs.basic:noop",
                            tenant="other", execution=Execution(idempotent=True)))
    with running_scheduler(module_settings, bindings,
                           tenants=TenantStore.from_settings(module_settings)) as sched:
        yield sched


def _runs(address: str, names: list[str], per_binding: int = 50) -> None:
    """One batch of every binding in ``names``; every item must succeed within 15 s (a
    scheduler whose loop spins answers nothing)."""
    cols = Columns()
    for name in names:
        for n in range(per_binding):
            cols.add(name, b'{"n": %d}' % n, None, None, 1, f"{name}/0/{n}", 0)
    with grpc.insecure_channel(address) as channel:
        submit = channel.unary_unary(SUBMIT, request_serializer=None,
                                     response_deserializer=None)
        outcomes = read_outcomes(submit(cols.encode(), timeout=15), range(len(cols)))
    assert {o["status"] for o in outcomes} == {"ok"}


@pytest.mark.parametrize("raw", BAD)
def test_a_bad_weight_in_redis_is_refused_and_every_tenant_served(
        raw: str, scheduler: Running, module_settings: Settings, redis_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asynctier.scheduler.tenants")
    tenant = _tenant(raw)
    key = module_settings.names.redis_key("tenant-weights")
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(key, tenant, "2.5")  # a good weight first: the one kept afterwards
        wait_until(lambda: any(f"'{tenant}': 2.5" in r.getMessage() for r in caplog.records),
                   10, f"the scheduler follows {tenant}'s weight 2.5")
        client.hset(key, tenant, raw)
        refused = wait_until(lambda: [r.getMessage() for r in caplog.records
                                      if f"tenant {tenant}: its weight" in r.getMessage()],
                             10, f"the weight {raw!r} refused, in the log")
        assert key in refused[0] and "keeps weight 2.5" in refused[0], refused[0]
        assert f"asynctier tenant set {tenant} --weight N" in refused[0], refused[0]
        _runs(scheduler.address, [tenant])  # alone in its tier
        _runs(scheduler.address, [tenant, "other"])  # beside another tenant
        client.hset(key, tenant, "-5")  # the follower is alive: a new bad value is seen too
        wait_until(lambda: any(f"tenant {tenant}: its weight" in r.getMessage()
                               and "'-5'" in r.getMessage() for r in caplog.records),
                   10, "the next bad value refused too")
        _runs(scheduler.address, [tenant, "other"])
    finally:
        client.hdel(key, tenant)
        client.close()


def test_hypothesis_corrupted_weights_never_reach_the_fair_queue(
        module_settings: Settings) -> None:
    """Any bytes in the weights hash (hypothesis): a follower's turn never raises, and the
    fair queue only ever holds weights from 0.01 to 1000."""
    import asyncio

    from hypothesis import given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    from asynctier.scheduler.queues import FairQueue
    from asynctier.scheduler.tenants import TenantFollower

    loop = asyncio.new_event_loop()
    store = TenantStore.from_settings(module_settings.with_overrides(
        prefix=module_settings.prefix + "h"))
    fair: FairQueue[int] = FairQueue()
    follower = TenantFollower(store, fair)
    values = st.one_of(st.binary(max_size=12), st.sampled_from(
        [b"nan", b"-inf", b"1e400", b"0x10", b" 3 ", b"1_000", b"\xff"]),
        st.floats().map(lambda f: repr(f).encode()))

    @hsettings(max_examples=300, deadline=None, database=None)
    @given(st.dictionaries(st.sampled_from(["a", "b", "\u00e9", ""]), values, min_size=1))
    def corrupt(written: dict[str, bytes]) -> None:
        async def turn() -> None:
            await store.client.delete(store.weights_key)
            await store.client.hset(store.weights_key, mapping=written)  # type: ignore[arg-type]
            await follower.turn()
        loop.run_until_complete(turn())
        for weight in follower.weights.values():
            assert 0.01 <= weight <= 1000
        for tier in fair._tiers.values():
            assert all(0.01 <= w <= 1000 for w in tier.drr.weights.values())

    try:
        corrupt()
    finally:
        loop.run_until_complete(store.client.delete(store.weights_key))
        loop.run_until_complete(store.close())
        loop.close()
