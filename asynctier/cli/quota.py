"""``asynctier quota set | show``: tenants' quotas per minute and per day, kept in Redis."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from asynctier.cli import settings_of
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.redis_client import REDIS_DOWN, async_client
from asynctier.scheduler.limits.quota import Quota, QuotaStore
from asynctier.submitter.capacity import EnqueueCapacity

T = TypeVar("T")

#: The tenant names a binding accepts (asynctier.platform.binding).
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _with_store(settings: Settings, fn: Callable[[QuotaStore], Awaitable[T]]) -> T:
    """Run ``fn`` on a QuotaStore of the configured Redis; an unreachable Redis is an
    error that names it."""

    async def run() -> T:
        client = async_client(settings.redis_url, socket_timeout=5.0,
                                socket_connect_timeout=5.0)
        try:
            return await fn(QuotaStore(client, settings.names))
        except REDIS_DOWN as exc:
            raise ServiceError(f"Redis at {settings.redis_display} does not answer: {exc}") from exc
        finally:
            await client.aclose()

    return asyncio.run(run())


async def quota_rows(store: QuotaStore) -> list[dict[str, Any]]:
    """Every tenant's quota and its usage in the current minute and UTC day; a quota
    refused as read (not applied by the schedulers) has ``refused`` saying why."""
    quotas = await store.all()
    rows: list[dict[str, Any]] = []
    for tenant, quota in quotas.good.items():
        usage = await store.usage(tenant)
        rows.append({"tenant": tenant, **quota.to_json(), "used_minute": usage.minute,
                     "used_day": usage.day, "refused": None})
    for tenant, why in quotas.refused.items():
        rows.append({"tenant": tenant, "per_minute": None, "per_day": None,
                     "used_minute": None, "used_day": None, "refused": why})
    return rows


@click.group()
def quota() -> None:
    """Tenants' quotas: items per minute and per UTC day; over it, items are delayed."""


@quota.command("set")
@click.argument("tenant")
@click.option("--per-minute", type=click.IntRange(min=1),
              help="Items per minute (omit: no limit per minute).")
@click.option("--per-day", type=click.IntRange(min=1),
              help="Items per UTC day (omit: no limit per day).")
@click.option("--enqueue-per-minute", type=click.IntRange(min=1),
              help="Workloads per minute the Submitters accept from TENANT (FOQS's "
                   "enqueue capacity; the rest are throttled with a retry-after).")
@click.pass_context
def set_(ctx: click.Context, tenant: str, per_minute: int | None, per_day: int | None,
         enqueue_per_minute: int | None) -> None:
    """Replace TENANT's quota (a window not given has no limit); --enqueue-per-minute
    alone sets only the Submitters' enqueue capacity."""
    if not _TENANT_RE.fullmatch(tenant):
        raise click.BadParameter("letters, digits, '.', '-', '_' (at most 63)",
                                 param_hint="TENANT")
    if per_minute is None and per_day is None and enqueue_per_minute is None:
        raise click.UsageError("give --per-minute N, --per-day N, --enqueue-per-minute N "
                               "or several")
    settings = settings_of(ctx)
    if enqueue_per_minute is not None:
        _set_capacity(settings, tenant, enqueue_per_minute)
        click.echo(f"{tenant}: {enqueue_per_minute} enqueued per minute")
    if per_minute is None and per_day is None:
        return
    click.echo(f"{tenant}: {_describe(set_quota(settings, tenant, per_minute, per_day))}")


def set_quota(settings: Settings, tenant: str, per_minute: int | None,
              per_day: int | None) -> dict[str, int | None]:
    """Replace ``tenant``'s quota (a window left None has no limit; both None lift it):
    what ``quota set`` and the console do; returns it as stored. The schedulers apply it
    from their next chunk."""
    quota = Quota(per_minute=per_minute, per_day=per_day)
    _with_store(settings, lambda store: store.set(tenant, quota))
    return quota.to_json()


def _set_capacity(settings: Settings, tenant: str, per_minute: int) -> None:
    async def run() -> None:
        client = async_client(settings.redis_url, socket_timeout=5.0,
                                socket_connect_timeout=5.0)
        try:
            await EnqueueCapacity(client, settings.names).set(tenant, per_minute)
        except REDIS_DOWN as exc:
            raise ServiceError(f"Redis at {settings.redis_display} does not answer: {exc}") from exc
        finally:
            await client.aclose()

    asyncio.run(run())


@quota.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON list instead of a table.")
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Every tenant's quota and what it used in the current minute and day."""
    rows = _with_store(settings_of(ctx), quota_rows)
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no quotas set")
        return
    click.echo(f"{'TENANT':<24} {'PER MINUTE':>12} {'USED':>8} {'PER DAY':>12} {'USED':>10}")
    for row in rows:
        if row["refused"]:
            click.echo(f"{row['tenant']:<24} refused: {row['refused']} (the schedulers apply "
                       f"no limit there; fix it with `asynctier quota set {row['tenant']} ...`)")
            continue
        click.echo(f"{row['tenant']:<24} {_limit(row['per_minute']):>12} "
                   f"{row['used_minute']:>8} {_limit(row['per_day']):>12} {row['used_day']:>10}")


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _describe(doc: dict[str, int | None]) -> str:
    return ", ".join(f"{_limit(v)} {k.replace('_', ' ')}" for k, v in doc.items())


COMMANDS = [quota]
