"""The platform on a real Redis Cluster: 3 masters and 3 replicas on loopback.

Each limit runs its own scripts on the cluster: a script touching a key of another slot
fails there (CROSSSLOT, or "non local key"), so each test passing shows its keys share a
hash tag. The cluster starts in about 3 s, once for the module.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis.cluster

from asynctier.dev import redis_cluster
from asynctier.dev.redis_cluster import RedisClusterNodes
from asynctier.dev.testing import start_test_redis_cluster
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.membership import live_members
from asynctier.platform.names import Names
from asynctier.platform.redis_client import async_client, is_cluster_url, sync_client
from asynctier.platform.wire import ok, retry
from asynctier.scheduler.guard import BUSY, DONE, RUN, TAKEN_OVER
from asynctier.scheduler.heartbeat import Heartbeat
from asynctier.scheduler.limits import Quota, RedisAdmission
from asynctier.submitter.capacity import EnqueueCapacity
from asynctier.tailers.parking import HELD, ParkingLot, Waiting
from tests.conftest import service_unavailable
from tests.helpers import MinuteClock
from tests.scheduler.test_limits_redis import make_items

BASE = Binding(name="orders", source=Source("kafka", "orders"), function="app.jobs:handle",
               tenant="acme")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    try:
        nodes = start_test_redis_cluster(tmp_path_factory.mktemp("rcluster"), replicas=1)
    except ServiceError as exc:
        service_unavailable("a Redis Cluster", exc)
    yield nodes
    nodes.stop(5.0)


@pytest.fixture
def csettings(cluster: RedisClusterNodes) -> Settings:
    return Settings(redis_url=cluster.url, prefix=f"t{uuid.uuid4().hex[:10]}")


def test_the_keys_of_each_script_share_one_slot() -> None:
    names = Names("asynctier")
    slot = redis.cluster.key_slot
    tenant = {slot(names.tenant_key("acme", k).encode())
              for k in ("quota", "quota-used", "charges:orders:499012",
                        "enqueue-capacity", "enqueue-used")}
    once = {slot(names.once_key("orders", *k).encode())
            for k in (("holders",), ("17",), ("17:orders/0:0",))}
    members = {slot(names.redis_tagged_key("schedulers", *k).encode())
               for k in ((), ("load",), ("place",))}
    assert len(tenant) == len(once) == len(members) == 1
    # and the tags spread tenants and bindings over the slots
    assert len({slot(names.once_key(f"b{i}", "1").encode()) for i in range(20)}) > 15


def test_a_cluster_url_names_its_nodes(cluster: RedisClusterNodes) -> None:
    assert is_cluster_url(cluster.url) and not is_cluster_url("redis://127.0.0.1:6379/0")
    client = sync_client(cluster.url, socket_timeout=2.0)
    try:
        assert isinstance(client, redis.cluster.RedisCluster)
        assert len(client.get_primaries()) == 3
    finally:
        client.close()
    with pytest.raises(ValueError, match="host:port"):
        sync_client("redis+cluster://127.0.0.1")


def test_rate_limit_holds_on_the_cluster(csettings: Settings) -> None:
    binding = BASE.with_changes(limits=replace(BASE.limits, rate_per_s=400.0))  # burst 400

    async def scenario() -> float:
        a, b = RedisAdmission(csettings), RedisAdmission(csettings)
        try:
            started = time.monotonic()
            for _ in range(5):  # 1,200 tokens from two schedulers: 800 past the burst
                await asyncio.gather(a.take_tokens(binding, 120), b.take_tokens(binding, 120))
            return time.monotonic() - started
        finally:
            await a.close()
            await b.close()

    elapsed = asyncio.run(scenario())
    assert 1.5 <= elapsed < 8.0, elapsed  # 2.0 s on an idle machine


def test_quota_charges_once_on_the_cluster(csettings: Settings) -> None:
    async def scenario() -> tuple[int, int, int]:
        admission = RedisAdmission(csettings, clock=MinuteClock(1_000))  # no minute turns
        try:
            await admission.quotas.set("acme", Quota(per_minute=5))
            first = await admission.over_quota(BASE, make_items([f"o/0/{i}" for i in range(8)]))
            again = await admission.over_quota(BASE, make_items([f"o/0/{i}" for i in range(5)]))
            listed = (await admission.quotas.all()).good
            assert listed == {"acme": Quota(per_minute=5)}
            used = await admission.quotas.usage("acme")
            return len(first), len(again), used.minute
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == (3, 0, 5)


def test_concurrency_cap_holds_across_two_schedulers_on_the_cluster(csettings: Settings) -> None:
    binding = BASE.with_changes(limits=replace(BASE.limits, max_concurrency=2))

    async def scenario() -> int:
        a, b = RedisAdmission(csettings), RedisAdmission(csettings)
        running, peak = 0, 0

        async def one(admission: RedisAdmission) -> None:
            nonlocal running, peak
            async with admission.slot(binding):
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.05)
                running -= 1

        try:
            await asyncio.gather(*(one(a if i % 2 else b) for i in range(12)))
            return peak
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(scenario()) == 2


def test_run_once_holds_on_the_cluster(csettings: Settings) -> None:
    guarded = BASE.with_changes(execution=replace(BASE.execution, idempotent=False))
    batch = make_items(["orders/1/1", "orders/1/2", "orders/1/3"])

    async def scenario() -> list[str]:
        a, b = RedisAdmission(csettings), RedisAdmission(csettings)
        try:
            seen = [await a.guard.claim(guarded, batch), await b.guard.claim(guarded, batch)]
            await a.guard.finish(guarded, batch[:2], [ok(0), retry(1, "boom")])
            seen.append(await b.guard.claim(guarded, batch))
            await a.guard.once.close()  # a died: no heartbeat, its holder is dropped
            seen.append(await b.guard.claim(guarded, batch[2:]))
            return seen
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(scenario()) == [RUN * 3, BUSY * 3, DONE + RUN + BUSY, TAKEN_OVER]


def test_parked_keys_hold_on_the_cluster(csettings: Settings) -> None:
    lot = ParkingLot.of(csettings, "orders")
    try:
        assert len({redis.cluster.key_slot(k.encode()) for k in (
            lot.head, lot.ready, lot.parked, lot.wait_key("ka"), lot.wait_key("kb"))}) == 1
        lot.park([("ka", "orders/0/1")])
        lot.push([("ka", Waiting("orders/0/2", b"a", b"v", [], 1)),
                  ("kb", Waiting("orders/0/3", b"b", b"v", [], 1))])
        assert lot.check([("ka", "orders/0/4")]) == [HELD]
        lot.unpark([("ka", "orders/0/1")])
        taken = sorted(lot.take(10))
        assert [k for k, _ in taken] == ["ka", "kb"]
        lot.done([(k, blob, False, "") for k, blob in taken])
        assert lot.take(10) == [] and lot.stats().keys == 0
    finally:
        lot.redis.close()


def test_membership_on_the_cluster(csettings: Settings) -> None:
    async def scenario() -> list[str]:
        beat = Heartbeat(csettings.with_overrides(region="eu"), "127.0.0.1:7001", lambda: 3,
                         capacity=7)
        try:
            assert await beat.beat()
            return [f"{m.address}={m.load}@{m.region}/{m.capacity}"
                    for m in live_members(csettings)]
        finally:
            await beat.stop()

    assert asyncio.run(scenario()) == ["127.0.0.1:7001=3@eu/7"]
    assert live_members(csettings) == []  # it left


def test_enqueue_capacity_on_the_cluster(csettings: Settings) -> None:
    async def scenario() -> list[int]:
        client = async_client(csettings.redis_url)
        try:
            mid_minute = (int(time.time()) // 60 * 60 + 30) * 1000  # no turn in between
            capacity = EnqueueCapacity(client, csettings.names, clock=lambda: mid_minute)
            await capacity.set("acme", 10)
            return [(await capacity.take("acme", 7))[0], (await capacity.take("acme", 7))[0]]
        finally:
            await client.aclose()

    granted = asyncio.run(scenario())
    assert granted == [7, 3]


def test_data_dir_is_per_node(cluster: RedisClusterNodes) -> None:
    assert len({n.data_dir for n in cluster.nodes}) == 6
    assert all((n.data_dir / "nodes.conf").is_file() for n in cluster.nodes)


def test_run_once_comes_back_on_the_replica_that_took_over_a_killed_master(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A master killed mid-run: claims fall back (fail_open) while its slots have no
    master, then the replica that took over answers with the successes it had: records
    done before the kill are still done (any forgotten one would run again: counted)."""
    try:
        nodes = start_test_redis_cluster(tmp_path_factory.mktemp("rfailover"), replicas=1)
    except ServiceError as exc:
        service_unavailable("a Redis Cluster", exc)
    settings = Settings(redis_url=nodes.url, prefix=f"t{uuid.uuid4().hex[:10]}")
    guarded = BASE.with_changes(execution=replace(BASE.execution, idempotent=False))
    before = [f"orders/0/{i}" for i in range(500)]
    after = [f"orders/1/{i}" for i in range(50)]

    async def scenario() -> tuple[str, str, str, int]:
        admission = RedisAdmission(settings)
        try:
            for s in range(0, len(before), 50):
                chunk = make_items(before[s:s + 50])
                await admission.guard.claim(guarded, chunk)
                await admission.guard.finish(guarded, chunk, [ok(i["id"]) for i in chunk])
            key = settings.names.once_key(guarded.name, "1")
            await asyncio.to_thread(nodes.wait_replicated, key)  # the replica has followed
            nodes.master_of(key).kill()
            during = await admission.guard.claim(guarded, make_items(["orders/2/1"]))
            await asyncio.to_thread(nodes.wait_ok)
            deadline = time.monotonic() + 20
            while True:  # the client finds the new master on its next calls
                first = await admission.guard.claim(guarded, make_items(after))
                if not admission.redis_down or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            await admission.guard.finish(guarded, make_items(after), [ok(i) for i in range(50)])
            again = await admission.guard.claim(guarded, make_items(after))
            old = await admission.guard.claim(guarded, make_items(before))
            return during, first, again, old.count(RUN)
        finally:
            await admission.close()
            nodes.stop(5.0)

    during, first, again, forgotten = asyncio.run(scenario())
    assert during == RUN  # fail_open: it runs (the guard is off for the outage)
    assert first == RUN * 50 and again == DONE * 50  # the guard works on the new master
    print(f"\nsuccesses forgotten by the failover: {forgotten} of {len(before)}")
    assert forgotten == 0


def test_a_port_taken_before_a_node_binds_it_gets_the_cluster_new_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process takes a chosen port before its node starts: the test cluster is
    made again on other free ports instead of failing the test (a CI run failed so)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    choose = redis_cluster.free_port
    first = iter([port])
    monkeypatch.setattr(redis_cluster, "free_port", lambda: next(first, None) or choose())
    try:
        nodes = start_test_redis_cluster(tmp_path)
        try:
            assert port not in {n.port for n in nodes.nodes}
            assert all(nodes._state_ok(n) for n in nodes.nodes)
        finally:
            nodes.stop(5.0)
    finally:
        taken.close()
