"""``asynctier schedulers``: the live schedulers by region, with their load and capacity."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.platform.membership import Member, live_members


def member_rows(members: list[Member]) -> list[dict[str, Any]]:
    """One row per live scheduler, by region then address: its load, capacity (0: not
    registered, an older scheduler), free room (None when unknown) and whether it is full."""
    rows = []
    for m in sorted(members, key=lambda m: (m.region, m.address)):
        free = max(0, m.capacity - m.load) if m.capacity else None
        rows.append({"region": m.region, "address": m.address, "tier": m.tier or "all",
                     "load": m.load, "capacity": m.capacity, "free": free,
                     "full": m.spot.full})
    return rows


def region_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per region: live schedulers, load and capacity summed."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        t = totals.setdefault(row["region"], {"schedulers": 0, "load": 0, "capacity": 0})
        t["schedulers"] += 1
        t["load"] += row["load"]
        t["capacity"] += row["capacity"]
    return totals


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for scripts.")
@click.pass_context
def schedulers(ctx: click.Context, as_json: bool) -> None:
    """List the live schedulers by region with their load (items queued or running) and
    capacity (full: a tailer of that region spills its calls to another region)."""
    settings = settings_of(ctx)
    rows = member_rows(live_members(settings))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no live scheduler is registered (start `asynctier run scheduler`)")
        return
    totals = region_totals(rows)
    table = Table("region", "address", "tier", "load", "capacity", "free", "state")
    for row in rows:
        table.add_row(row["region"], row["address"], row["tier"], str(row["load"]),
                      str(row["capacity"] or "-"),
                      "-" if row["free"] is None else str(row["free"]),
                      "full" if row["full"] else "ok")
    Console().print(table)
    for region, t in totals.items():
        click.echo(f"region {region}: {t['schedulers']} scheduler(s), load {t['load']} of "
                   f"{t['capacity'] or '-'}")


COMMANDS = [schedulers]
