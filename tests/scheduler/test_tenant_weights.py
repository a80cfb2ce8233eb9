"""Tenant weights: the CLI stores them in Redis, a scheduler's follower applies them live to
its fair queue and shares what each tenant started."""

from __future__ import annotations

import asyncio
import json

import redis
from click.testing import CliRunner
from redis.asyncio import Redis

from asynctier.cli import main
from asynctier.platform.config import Settings
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.queues import FairQueue
from asynctier.scheduler.tenants import TenantFollower


def run(settings: Settings, *args: str) -> tuple[int, str]:
    env = {"ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
           "ASYNCTIER_CONFIG": ""}
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def _shares(fair: FairQueue[str], n: int) -> dict[str, int]:
    for _ in range(n):
        fair.push("normal", "acme", "a", 1)
        fair.push("normal", "zeta", "z", 1)
    got = [fair.pop() for _ in range(n)]
    while fair:
        fair.pop()
    return {"a": got.count("a"), "z": got.count("z")}


def test_new_weights_change_the_shares_of_a_running_queue() -> None:
    fair: FairQueue[str] = FairQueue(quantum=4)
    assert _shares(fair, 400) == {"a": 200, "z": 200}
    fair.set_tenant_weights({"acme": 3.0})
    assert _shares(fair, 400) == {"a": 300, "z": 100}
    assert fair.take_started() == {"acme": 800, "zeta": 800}  # every item pushed was popped
    assert fair.take_started() == {}


def test_set_show_and_the_follower_applies_them(settings: Settings,
                                                redis_client: redis.Redis) -> None:
    code, out = run(settings, "tenant", "set", "acme", "--weight", "3")
    assert code == 0 and "acme: weight 3" in out, out
    code, out = run(settings, "tenant", "set", "bad name!", "--weight", "3")
    assert code != 0 and "letters, digits" in out

    async def follow() -> dict[str, float]:
        client = Redis.from_url(settings.redis_url)
        fair: FairQueue[str] = FairQueue(quantum=4)
        follower = TenantFollower(TenantStore(client, settings.names), fair)
        _shares(fair, 8)  # 4 items each started here
        await follower.turn()
        weights = fair._tiers["normal"].drr.weights
        await client.aclose()
        return weights
    assert asyncio.run(follow()) == {"acme": 3.0}
    code, out = run(settings, "tenant", "show", "--json")
    rows = {r["tenant"]: r for r in json.loads(out)}
    assert rows["acme"]["weight"] == 3.0 and rows["acme"]["started_this_minute"] >= 4
    assert rows["zeta"]["weight"] == 1.0
    code, out = run(settings, "tenant", "show")
    assert code == 0 and "acme" in out and "WEIGHT" in out
