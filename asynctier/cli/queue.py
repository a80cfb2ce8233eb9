"""``asynctier enqueue TOPIC`` and ``asynctier queue stats | show | cancel | dead | replay |
shards``: the queue source from the command line."""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.cli.progress import progress
from asynctier.platform.durations import parse_duration
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.admin import EnqueueReport, LineOptions, enqueue_lines, replay_at_rate
from asynctier.queue.items import MAX_PRIORITY, MIN_PRIORITY
from asynctier.queue.shards import ShardedQueue

#: How many refused lines ``enqueue`` prints before it only counts them.
SHOW_REFUSED = 50


def _namespace_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--namespace", "-n", default="default", show_default=True,
                        envvar="ASYNCTIER_QUEUE_NAMESPACE",
                        help="The topic's namespace (a binding's tenant) "
                             "[env ASYNCTIER_QUEUE_NAMESPACE].")(fn)


def _queue(ctx: click.Context) -> ShardedQueue:
    return ShardedQueue.from_settings(settings_of(ctx), pool_size=2)


def _check_bound(ctx: click.Context, namespace: str, topic: str) -> None:
    """Refuse a topic no queue binding of ``namespace`` reads: its items would wait forever."""
    bindings = BindingRegistry(settings_of(ctx)).load().values()
    if any(b.source.kind == "queue" and b.source.topic == topic and b.tenant == namespace
           for b in bindings):
        return
    raise click.UsageError(
        f"no binding reads queue topic {topic!r} in namespace {namespace!r}, so nothing "
        f"would run its items: bind one first (asynctier bind NAME --queue {topic} --tenant "
        f"{namespace} --function module:fn), check --namespace, or pass --unbound")


def _delay(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command()
@click.argument("topic")
@_namespace_option
@click.option("--priority", type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY), default=0,
              show_default=True, help="Every item's priority (higher runs first).")
@click.option("--delay", callback=_delay, help="Ready only after this long (30s, 5m).")
@click.option("--id-field", help="Take each item's id from this JSON field (an item whose "
                                 "id is there already is skipped).")
@click.option("--unbound", is_flag=True,
              help="Enqueue even when no binding reads TOPIC in this namespace (yet).")
@click.option("--after", "after", default="", metavar="ID[,ID...]",
              help="Every item waits until these items (of --after-topic) are acked.")
@click.option("--after-topic", help="The topic of the --after ids [default: TOPIC].")
@click.option("--after-field", help="Each line's parents: the id(s) in this JSON field.")
@click.option("--on-parent-failure", type=click.Choice(["fail", "run"]), default="fail",
              show_default=True,
              help="When a parent dies: die too (parent_failed), or run all the same.")
@click.pass_context
def enqueue(ctx: click.Context, topic: str, namespace: str, priority: int,
            delay: float | None, id_field: str | None, unbound: bool, after: str,
            after_topic: str | None, after_field: str | None,
            on_parent_failure: str) -> None:
    """Enqueue each JSON line of stdin as one item of TOPIC (its JSON text is the payload).

    Bad lines (not JSON, over 1 MiB, a bad id) are refused with their line number and
    the reason; the other lines are enqueued; the exit code is 1 when any was refused.
    A topic that no queue binding of the namespace reads is refused (nothing would run
    its items) unless --unbound. With --after (or --after-field), an item waits until
    every parent named is acked; a parent must exist already (or be an earlier line).
    """
    if not unbound:
        _check_bound(ctx, namespace, topic)
    options = LineOptions(topic, priority, delay, id_field,
                          after=tuple(p.strip() for p in after.split(",") if p.strip()),
                          after_topic=after_topic, after_field=after_field,
                          on_parent_failure=on_parent_failure)
    with _queue(ctx) as queue, progress() as bar:
        task = bar.add_task(f"enqueueing to {topic}", total=None)

        def tick(report: EnqueueReport) -> None:
            bar.update(task, completed=report.created + report.existing)

        report = enqueue_lines(queue, namespace, sys.stdin, options, tick=tick)
    for _line, reason in report.refused[:SHOW_REFUSED]:
        click.echo(f"refused: {reason}", err=True)
    if len(report.refused) > SHOW_REFUSED:
        click.echo(f"... and {len(report.refused) - SHOW_REFUSED} more refused line(s)",
                   err=True)
    click.echo(f"enqueued {report.created} item(s) to {namespace}/{topic}; "
               f"{report.existing} already there (same id); "
               f"{len(report.refused)} line(s) refused", err=True)
    if report.refused:
        sys.exit(1)


@click.group()
def queue() -> None:
    """The queue source: counts, one item, cancel, dead items, replay, shards, failover."""


@queue.command()
@click.argument("topic", required=False)
@_namespace_option
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.option("--running", "show_running", type=click.IntRange(min=0), default=10,
              show_default=True, help="List this many items running, the longest first.")
@click.pass_context
def stats(ctx: click.Context, topic: str | None, namespace: str, as_json: bool,
          show_running: int) -> None:
    """Ready, delayed, waiting (for parents), leased and dead items and the oldest ready
    age, per topic; then
    the items running (leased) the longest: their age, last heartbeat and checkpoint."""
    with _queue(ctx) as q:
        rows = [{**dataclasses.asdict(c), "shard": q.shard_of(namespace, c.topic).name}
                for c in q.counts(namespace, topic)]
        running = q.running(namespace, topic, show_running) if show_running else []
    if as_json:
        for row in rows:
            row["running"] = [dataclasses.asdict(r) for r in running if r.topic == row["topic"]]
        click.echo(json.dumps(rows, indent=2))
        return
    console = Console(soft_wrap=not sys.stdout.isatty())
    table = Table("topic", "ready", "delayed", "waiting", "leased", "dead", "oldest ready",
                  "shard", title=f"queue {namespace}", title_justify="left")
    for row in rows:
        table.add_row(row["topic"], str(row["ready"]), str(row["delayed"]),
                      str(row["waiting"]), str(row["leased"]), str(row["dead"]),
                      f"{row['oldest_ready_age_s']:.1f}s", row["shard"])
    console.print(table)
    if not rows:
        click.echo(f"no queue topics in namespace {namespace}")
    if running:
        console.print(_running_table(running, namespace))


def _show_progress(info: Any) -> None:
    """How long a running item has run, its last heartbeat and checkpoint, as ages."""
    now_ms = time.time() * 1000
    if info.leased_ms is not None:
        click.echo(f"{'running for:':18} {(now_ms - info.leased_ms) / 1000:.1f}s")
    if info.heartbeat_ms is not None:
        click.echo(f"{'last heartbeat:':18} {_ago((now_ms - info.heartbeat_ms) / 1000)}")
    if info.checkpoint_ms is not None:
        click.echo(f"{'last checkpoint:':18} {_ago((now_ms - info.checkpoint_ms) / 1000)} "
                   f"({info.checkpoint_bytes:,} bytes)")


def _show_family(info: Any) -> None:
    """An item's parents and their states, its waiting children, and how long it waited."""
    for topic, item_id, state in info.parents:
        click.echo(f"{'parent:':18} {topic}/{item_id} ({state})")
    if info.released_ms is not None:
        click.echo(f"{'waited:':18} {(info.released_ms - info.enqueued_ms) / 1000:.3f}s for "
                   "its parents")
    for topic, item_id in info.children:
        click.echo(f"{'waiting child:':18} {topic}/{item_id}")


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s ago"


def _running_table(running: Any, namespace: str) -> Table:
    """The items running, the longest first."""
    table = Table("topic", "id", "attempt", "running for", "last heartbeat",
                  "last checkpoint", "owner", title=f"running in {namespace} (longest first)",
                  title_justify="left")
    for r in running:
        size = "" if r.checkpoint_bytes is None else f" ({r.checkpoint_bytes:,} B)"
        table.add_row(r.topic, r.id, str(r.attempt), f"{r.age_s:.1f}s",
                      _ago(r.heartbeat_age_s), _ago(r.checkpoint_age_s) + size, r.owner)
    return table


def _payload_text(payload: bytes) -> tuple[str, str]:
    try:
        return "utf-8", payload.decode()
    except UnicodeDecodeError:
        return "base64", base64.b64encode(payload).decode()


def _headers_json(headers: Any) -> list[dict[str, str | None]]:
    return [{"name": name, "value": None if value is None else _payload_text(value)[1]}
            for name, value in headers]


@queue.command()
@click.argument("topic")
@click.argument("item_id", metavar="ID")
@_namespace_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def show(ctx: click.Context, topic: str, item_id: str, namespace: str, as_json: bool) -> None:
    """One item, in whichever state it is (dead ones too); exit 1 when there is none."""
    with _queue(ctx) as q:
        info = q.get(namespace, topic, item_id)
    if info is None:
        click.echo(f"no item {item_id!r} in {namespace}/{topic}", err=True)
        sys.exit(1)
    doc = dataclasses.asdict(info)
    doc["payload_encoding"], doc["payload"] = _payload_text(info.payload)
    doc["headers"] = _headers_json(info.headers)
    doc["trace"] = info.trace_id
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for name, value in doc.items():
        if name not in ("payload", "headers", "parents", "children", "trace") and value not in (
                None, "", ()):
            click.echo(f"{name + ':':18} {value}")
    _show_progress(info)
    _show_family(info)
    click.echo(f"{'trace:':18} {info.trace_id}")
    for header in doc["headers"]:
        click.echo(f"header {header['name']}: {header['value']}")
    click.echo(f"payload ({doc['payload_encoding']}, {len(info.payload):,} bytes):")
    click.echo(doc["payload"])


@queue.command()
@click.argument("topic")
@click.argument("item_id", metavar="ID")
@_namespace_option
@click.pass_context
def cancel(ctx: click.Context, topic: str, item_id: str, namespace: str) -> None:
    """Delete one item (live or dead); exit 1 when there is none."""
    with _queue(ctx) as q:
        gone = q.cancel(namespace, topic, item_id)
    if not gone:
        click.echo(f"no item {item_id!r} in {namespace}/{topic}", err=True)
        sys.exit(1)
    click.echo(f"cancelled {item_id!r} of {namespace}/{topic}")


@queue.command("run-now")
@click.argument("topic")
@click.argument("item_id", metavar="ID")
@_namespace_option
@click.pass_context
def run_now(ctx: click.Context, topic: str, item_id: str, namespace: str) -> None:
    """Make a delayed item (waiting out a retry's backoff or its deliver-after) due now;
    exit 1 when there is no delayed item ID (a ready, running or waiting one is left)."""
    with _queue(ctx) as q:
        done = q.run_now(namespace, topic, item_id)
    if not done:
        click.echo(f"no delayed item {item_id!r} in {namespace}/{topic} (`asynctier queue "
                   "show` says what state it is in)", err=True)
        sys.exit(1)
    click.echo(f"{item_id!r} of {namespace}/{topic} is due now")


@queue.command()
@click.argument("topic")
@_namespace_option
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_context
def dead(ctx: click.Context, topic: str, namespace: str, limit: int, as_json: bool) -> None:
    """The dead items of TOPIC with their reason and last error, oldest death first."""
    with _queue(ctx) as q:
        items = q.dead_items(namespace, topic, limit)
    rows = []
    for item in items:
        doc = dataclasses.asdict(item)
        doc["payload_encoding"], doc["payload"] = _payload_text(item.payload)
        doc["headers"] = _headers_json(item.headers)
        rows.append(doc)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("id", "attempts", "reason", "error", "payload")
    for row in rows:
        table.add_row(row["id"], str(row["attempts"]), row["reason"],
                      _short(row["error"], 60), _short(row["payload"], 40))
    Console(soft_wrap=not sys.stdout.isatty()).print(table)
    click.echo(f"{len(rows)} dead item(s) in {namespace}/{topic}")


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@queue.command()
@click.argument("topic")
@_namespace_option
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most N items.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True, max=1_000_000),
              help="About N items a second at most.")
@click.option("--id", "ids", multiple=True, help="Replay only this item (repeatable).")
@click.pass_context
def replay(ctx: click.Context, topic: str, namespace: str, limit: int | None,
           rate: float | None, ids: tuple[str, ...]) -> None:
    """Put dead items back as ready, attempts reset, oldest death first. The
    ``parent_failed`` descendants of a replayed item come back with it, waiting for it."""
    with _queue(ctx) as q:
        count = q.replay(namespace, topic, limit, list(ids)) if ids else \
            replay_at_rate(q, namespace, topic, limit, rate)
    click.echo(f"replayed {count} dead item(s) of {namespace}/{topic}")


@queue.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON object.")
@click.pass_context
def shards(ctx: click.Context, as_json: bool) -> None:
    """The shards, and which shard holds which topic (and where each hashes to)."""
    from asynctier.queue.dsn import probe, redact_dsn

    with _queue(ctx) as q:
        names = [route.name for route in q.routes]
        hosts = {route.name: [(redact_dsn(h), probe(h)) for h in route.hosts]
                 for route in q.routes if len(route.hosts) > 1}
        placement = q.placement()
    doc = {"shards": names,
           "hosts": {name: [{"host": h, "state": s.describe() if s else "no answer"}
                            for h, s in found] for name, found in hosts.items()},
           "topics": [{"namespace": ns, "topic": t, "shard": home, "held_on": on}
                      for ns, t, home, on in placement]}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for name in names:
        click.echo(f"shard {name}")
        for host, state in hosts.get(name, []):
            click.echo(f"  host {host}: {state.describe() if state else 'no answer'}")
    for ns, t, home, on in placement:
        note = "" if on == [home] else f"  (items still on {', '.join(on)}: placed before " \
                                       "the shards changed)"
        click.echo(f"{ns}/{t} -> {home}{note}")


def _shard_dsns(ctx: click.Context, shard: str | None) -> list[str]:
    """The configured address of the shard named ``shard`` (as ``queue shards`` prints
    it), or of every shard when None."""
    from asynctier.queue.dsn import redact_dsn

    dsns = list(settings_of(ctx).queue_shards)
    if shard is None:
        return dsns
    found = [d for d in dsns if redact_dsn(d) == shard]
    if not found:
        names = ", ".join(redact_dsn(d) for d in dsns)
        raise click.UsageError(f"no queue shard is named {shard!r}; the shards are: {names} "
                               "(asynctier queue shards lists them)")
    return found


@queue.command()
@click.argument("shard", required=False)
@click.option("--auto", is_flag=True, help="Watch the shards and fail over by itself once "
                                           "a primary has not answered for --after.")
@click.option("--after", "after", default="3s", show_default=True, callback=_delay,
              help="With --auto: how long no host of a shard may be primary before its "
                   "standby is promoted.")
@click.pass_context
def failover(ctx: click.Context, shard: str | None, auto: bool, after: float) -> None:
    """Promote SHARD's standby to primary (pg_promote); tailers and Submitters move to it
    by themselves. A primary that still answers is fenced first (read-only, its sessions
    ended). With --auto, watch SHARD (or every shard with a standby) until stopped and
    fail over when its primary has been gone for --after and the standby lost it too."""
    from asynctier.platform.errors import AsynctierError
    from asynctier.queue.failover import fail_over, watch

    dsns = _shard_dsns(ctx, shard)
    if not auto:
        if shard is None:
            raise click.UsageError("name the shard to fail over (asynctier queue shards "
                                   "lists them), or pass --auto to watch every shard")
        try:
            click.echo(fail_over(dsns[0]).describe())
        except AsynctierError as exc:
            raise click.ClickException(str(exc)) from exc
        return
    import threading

    from asynctier.platform.signals import stop_on_signals

    stop = threading.Event()
    stop_on_signals(stop)
    click.echo(f"watching {len(dsns)} shard(s); failing over after {after:g} s without a "
               "primary", err=True)
    try:
        watch(dsns, after, stop, on_promotion=lambda p: click.echo(p.describe()))
    except AsynctierError as exc:
        raise click.ClickException(str(exc)) from exc


COMMANDS = [enqueue, queue]
