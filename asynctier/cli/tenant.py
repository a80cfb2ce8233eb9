"""``asynctier tenant set | show``: tenants' weights (fair shares), usage and quotas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from asynctier.cli import settings_of
from asynctier.cli.quota import _TENANT_RE
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis, async_client
from asynctier.scheduler.limits.quota import QuotaStore
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.queues import MAX_WEIGHT, MIN_WEIGHT

T = TypeVar("T")


def _with_redis(settings: Settings, fn: Callable[[AsyncRedis], Awaitable[T]]) -> T:
    """``fn`` on a Redis client of its own; ServiceError when Redis does not answer."""
    async def run() -> T:
        client = async_client(settings.redis_url, socket_timeout=5.0,
                                socket_connect_timeout=5.0)
        try:
            return await fn(client)
        except REDIS_DOWN as exc:
            raise ServiceError(f"Redis at {settings.redis_url} does not answer: {exc}") from exc
        finally:
            await client.aclose()
    return asyncio.run(run())


async def tenant_rows(client: AsyncRedis, settings: Settings) -> list[dict[str, Any]]:
    """Every tenant with a weight, a quota or usage: weight, items started over all
    schedulers this minute and the last, share of the last minute, quota and its use."""
    tenants = TenantStore(client, settings.names)
    quotas = QuotaStore(client, settings.names)
    weights, refused = await tenants.weights()
    now, before = await tenants.usage()
    limits = (await quotas.all()).good
    total_before = sum(before.values())
    rows = []
    for name in sorted(set(weights) | set(refused) | set(now) | set(before) | set(limits)):
        quota = limits.get(name)
        used = await quotas.usage(name) if quota is not None else None
        rows.append({
            "tenant": name, "weight": weights.get(name, 1.0),
            "weight_refused": refused.get(name),
            "started_this_minute": now.get(name, 0),
            "started_last_minute": before.get(name, 0),
            "share_last_minute": (before.get(name, 0) / total_before) if total_before else None,
            "quota_per_minute": quota.per_minute if quota else None,
            "quota_per_day": quota.per_day if quota else None,
            "quota_used_minute": used.minute if used else None,
            "quota_used_day": used.day if used else None,
        })
    return rows


def read_tenants(settings: Settings) -> list[dict[str, Any]]:
    """Every tenant's row (:func:`tenant_rows`): what ``tenant show`` prints."""
    return _with_redis(settings, lambda c: tenant_rows(c, settings))


def set_weight(settings: Settings, name: str, weight: float) -> None:
    """Set tenant ``name``'s weight (from MIN_WEIGHT to MAX_WEIGHT): what ``tenant set``
    does; every scheduler follows it within a second."""
    _with_redis(settings, lambda c: TenantStore(c, settings.names).set_weight(name, weight))


@click.group()
def tenant() -> None:
    """Tenants' weights: their shares of the schedulers within every tier."""


@tenant.command("set")
@click.argument("name")
@click.option("--weight", type=click.FloatRange(min=MIN_WEIGHT, max=MAX_WEIGHT), required=True,
              help="Its share against other tenants' (1 when never set): with weights 3 "
                   "and 1, a backlogged tenant gets 3 items run for every 1 of the other.")
@click.pass_context
def set_(ctx: click.Context, name: str, weight: float) -> None:
    """Set tenant NAME's weight; every scheduler follows it within a second."""
    if not _TENANT_RE.fullmatch(name):
        raise click.BadParameter("letters, digits, '.', '-', '_' (at most 63)",
                                 param_hint="NAME")
    set_weight(settings_of(ctx), name, weight)
    click.echo(f"{name}: weight {weight:g}")


@tenant.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON list instead of a table.")
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Every tenant's weight, the items it started over all schedulers, its quota."""
    rows = read_tenants(settings_of(ctx))
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no tenant has a weight, a quota or usage yet")
        return
    click.echo(f"{'TENANT':<20} {'WEIGHT':>7} {'STARTED/MIN':>12} {'LAST MIN':>9} "
               f"{'SHARE':>6} {'QUOTA/MIN':>10} {'QUOTA/DAY':>10}")
    for r in rows:
        share = "-" if r["share_last_minute"] is None else f"{r['share_last_minute']:.0%}"
        click.echo(f"{r['tenant']:<20} {r['weight']:>7g} {r['started_this_minute']:>12} "
                   f"{r['started_last_minute']:>9} {share:>6} "
                   f"{_q(r['quota_per_minute'], r['quota_used_minute']):>10} "
                   f"{_q(r['quota_per_day'], r['quota_used_day']):>10}")
    for r in rows:
        if r["weight_refused"]:
            click.echo(f"tenant {r['tenant']}: the weight in Redis is refused "
                       f"({r['weight_refused']}); schedulers keep the one they had. Fix: "
                       f"asynctier tenant set {r['tenant']} --weight N")


def _q(limit: int | None, used: int | None) -> str:
    return "-" if limit is None else f"{used or 0}/{limit}"


COMMANDS = [tenant]
