"""``asynctier schedule add | list | show | pause | resume | remove | run``: schedules that
enqueue one queue item per tick (:mod:`asynctier.schedules`)."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.cli.queue import _check_bound, _namespace_option
from asynctier.platform.durations import parse_duration
from asynctier.platform.errors import DecodeError, ScheduleError
from asynctier.platform.payloads import decoder_for
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.signals import stop_on_signals
from asynctier.platform.supervise import Supervisor
from asynctier.queue.items import MAX_PRIORITY, MIN_PRIORITY
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules.loop import POLL_S, STOP_RELAY_S, ScheduleLoop, start_relays
from asynctier.schedules.spec import (
    CATCH_UPS,
    DEFAULT_CATCH_UP_MAX,
    DEFAULT_GRACE_S,
    Schedule,
    iso,
)
from asynctier.schedules.store import ScheduleStore


def _queue(ctx: click.Context) -> ShardedQueue:
    return ShardedQueue.from_settings(settings_of(ctx), pool_size=2)


def _seconds(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _every(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = 0.0
    if seconds < 1 or not seconds.is_integer():
        raise click.BadParameter(f"{value!r} is not a valid interval: give whole seconds, at "
                                 "least 1s (for example 30s, 5m, 1h)")
    return int(seconds)


@click.group()
def schedule() -> None:
    """Schedules: one item on a queue topic, or one record on a Kafka topic, per tick (cron
    or --every)."""


@schedule.command()
@click.argument("name")
@_namespace_option
@click.option("--cron", help="Five cron fields, e.g. '*/5 * * * *' (in --timezone).")
@click.option("--every", callback=_every, help="Tick every this long (30s, 5m; >= 1s).")
@click.option("--timezone", default="UTC", show_default=True,
              help="IANA time zone of --cron (Europe/Paris).")
@click.option("--queue", "queue_topic", help="The queue topic each tick feeds.")
@click.option("--topic", "kafka_topic",
              help="Or: the Kafka topic each tick is written to (once, by the relay).")
@click.option("--payload", default="{}", show_default=True,
              help="A JSON object; each tick adds schedule, tick and tick_ms to it.")
@click.option("--priority", type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY), default=0,
              show_default=True, help="Each tick item's priority.")
@click.option("--expire-after", callback=_seconds,
              help="A tick item not leased this long after its firing dies 'expired'.")
@click.option("--catch-up", type=click.Choice(CATCH_UPS), default="none", show_default=True,
              help="Ticks missed while the platform was down: fire none, the last, or all.")
@click.option("--catch-up-max", type=click.IntRange(min=1), default=DEFAULT_CATCH_UP_MAX,
              show_default=True, help="--catch-up all fires at most this many (the latest).")
@click.option("--grace", callback=_seconds, default=f"{DEFAULT_GRACE_S:g}s", show_default=True,
              help="A tick found later than this counts as missed.")
@click.option("--replace", is_flag=True, help="Replace the schedule NAME if it exists.")
@click.option("--unbound", is_flag=True,
              help="Add it even when no binding reads the queue topic (yet).")
@click.pass_context
def add(ctx: click.Context, name: str, namespace: str, cron: str | None, every: int | None,
        timezone: str, queue_topic: str | None, kafka_topic: str | None, payload: str,
        priority: int, expire_after: float | None, catch_up: Any, catch_up_max: int,
        grace: float, replace: bool, unbound: bool) -> None:
    """Add (or --replace) the schedule NAME: one item on --queue TOPIC, or one record on
    Kafka --topic TOPIC, per tick."""
    if (queue_topic is None) == (kafka_topic is None):
        raise click.UsageError("give exactly one of --queue TOPIC (a queue topic) or --topic "
                               "TOPIC (a Kafka topic)")
    topic = queue_topic or kafka_topic or ""
    spec = Schedule(namespace=namespace, name=name, topic=topic, cron=cron,
                    every_s=every, timezone=timezone, payload=payload,
                    priority=priority, expire_s=expire_after, catch_up=catch_up,
                    catch_up_max=catch_up_max, grace_s=grace,
                    target="queue" if queue_topic else "kafka")
    if not unbound:
        if spec.target == "queue":
            _check_bound(ctx, namespace, topic)
        else:
            _check_kafka_bound(ctx, topic)
        _check_decodes(ctx, spec)
    with _queue(ctx) as q:
        info = ScheduleStore(q).add(spec, replace=replace)
    where = f"queue {namespace}/{topic}" if spec.target == "queue" else f"Kafka topic {topic}"
    click.echo(f"schedule {name} (version {info.version}): {spec.when()} -> {where}; next "
               f"tick {iso(info.next_ms)}")


def _check_kafka_bound(ctx: click.Context, topic: str) -> None:
    """Refuse a Kafka topic no binding reads: its records would wait forever."""
    if any(b.source.kind == "kafka" and b.source.topic == topic
           for b in BindingRegistry(settings_of(ctx)).load().values()):
        return
    raise click.UsageError(f"no binding reads Kafka topic {topic!r}, so nothing would run its "
                           f"records: bind one first (asynctier bind NAME --topic {topic} "
                           "--function module:fn), or pass --unbound")


def _check_decodes(ctx: click.Context, spec: Schedule) -> None:
    """Refuse a schedule whose tick items the bindings reading its topic cannot decode
    (an avro binding, say): every tick would be a dead item."""
    tick = spec.tick_payload(spec.after(0))
    for b in BindingRegistry(settings_of(ctx)).load().values():
        source = b.source
        reads = (source.kind == "kafka" and source.topic == spec.topic
                 if spec.target == "kafka"
                 else source.kind == "queue" and source.topic == spec.topic
                 and b.tenant == spec.namespace)
        if reads:
            try:
                decoder_for(b)(tick)
            except DecodeError as exc:
                raise ScheduleError(
                    f"schedule {spec.name!r}: binding {b.name} reads {spec.target} topic "
                    f"{spec.topic!r} as {b.payload.format} and cannot decode a tick's item "
                    f"({exc}); a tick is a JSON object: target a binding with --format json or "
                    "bytes") from None


@schedule.command(name="list")
@_namespace_option
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_context
def list_(ctx: click.Context, namespace: str, as_json: bool) -> None:
    """Every schedule: next and last firing, lateness, state."""
    with _queue(ctx) as q:
        docs = [i.doc() for i in ScheduleStore(q).list(namespace)]
    if as_json:
        click.echo(json.dumps(docs, indent=2))
        return
    table = Table("name", "state", "when", "target", "next", "last tick", "lateness", "fired",
                  "skipped", title=f"schedules {namespace}", title_justify="left")
    for d in docs:
        late = "" if d["lateness_s"] is None else f"{d['lateness_s']:.2f}s"
        target = "" if d["topic"] is None else f"{d['target']} {d['topic']}"
        table.add_row(d["name"], d["state"], d["when"] or d["error"], target,
                      d["next"], d["last_tick"] or "never", late, str(d["fired"]),
                      str(d["skipped"]))
    Console(soft_wrap=not sys.stdout.isatty()).print(table)
    if not docs:
        click.echo(f"no schedules in namespace {namespace}")


@schedule.command()
@click.argument("name")
@_namespace_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def show(ctx: click.Context, name: str, namespace: str, as_json: bool) -> None:
    """One schedule in full; exit 1 when there is none."""
    with _queue(ctx) as q:
        info = ScheduleStore(q).get(namespace, name)
    if info is None:
        click.echo(f"no schedule {name!r} in namespace {namespace!r}", err=True)
        sys.exit(1)
    doc = info.doc()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for key, value in doc.items():
        if value not in (None, ""):
            click.echo(f"{key + ':':12} {value}")


def _change(verb: str) -> click.Command:
    @click.command(name=verb)
    @click.argument("name")
    @_namespace_option
    @click.pass_context
    def change(ctx: click.Context, name: str, namespace: str) -> None:
        with _queue(ctx) as q:
            info = getattr(ScheduleStore(q), verb)(namespace, name)
        click.echo(f"schedule {name}: {info.state}; next tick {iso(info.next_ms)}")

    change.help = {"pause": "Stop firing NAME (ticks while paused are never fired).",
                   "resume": "Fire NAME again, from its first tick after now."}[verb]
    return change


schedule.add_command(_change("pause"))
schedule.add_command(_change("resume"))


@schedule.command()
@click.argument("name")
@_namespace_option
@click.pass_context
def remove(ctx: click.Context, name: str, namespace: str) -> None:
    """Delete the schedule NAME (items it enqueued stay); exit 1 when there is none."""
    with _queue(ctx) as q:
        gone = ScheduleStore(q).remove(namespace, name)
    if not gone:
        click.echo(f"no schedule {name!r} in namespace {namespace!r}", err=True)
        sys.exit(1)
    click.echo(f"removed schedule {name} of {namespace}")


@schedule.command()
@click.option("--poll", "poll_s", callback=_seconds, default=f"{POLL_S * 1000:g}ms",
              show_default=True, help="Look for due ticks this often at most.")
@click.option("--only", "namespaces", multiple=True,
              help="Fire only this namespace's schedules (repeatable; default: all).")
@click.pass_context
def run(ctx: click.Context, poll_s: float, namespaces: tuple[str, ...]) -> None:
    """Run only the schedule loop until SIGTERM (`asynctier run tailers` runs it too)."""
    stop = threading.Event()
    stop_on_signals(stop)
    with _queue(ctx) as q:
        loop = ScheduleLoop(q, poll_s=poll_s, namespaces=namespaces or None)
        relays = start_relays(settings_of(ctx), q, stop)
        Supervisor("schedules", loop.run, stop, what="the schedule loop",
                   hint="is the queue's PostgreSQL up?").start().join()
        for relay in relays:
            relay.join(STOP_RELAY_S)


COMMANDS = [schedule]
