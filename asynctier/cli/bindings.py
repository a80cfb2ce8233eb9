"""``asynctier bind``, ``unbind`` and ``bindings``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.cli.lag import read_tailers
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.allowlist import check_function_allowed
from asynctier.platform.binding import PRIORITIES, Binding, Priority
from asynctier.platform.binding_features import (
    DEFAULT_LADDER_S,
    FORMATS,
    ISOLATIONS,
    Breaker,
    Deadlines,
    Execution,
    Isolation,
    Limits,
    Ordering,
    Payload,
    PayloadFormat,
    RedisPolicy,
    Retries,
    Source,
)
from asynctier.platform.config import Settings
from asynctier.platform.durations import epoch_ms, format_duration, parse_duration, parse_ladder
from asynctier.platform.errors import BindingError, ModuleNotAllowed
from asynctier.platform.framed import RegistryClients, check_reader_schema
from asynctier.platform.kafka import admin, ensure_topics, topic_partitions, topic_replication
from asynctier.platform.paused import set_paused
from asynctier.platform.registry import BindingRegistry
from asynctier.scheduler.limits.breaker import parse_breaker

#: How long ``bind`` looks again for a topic it does not find: one created by another tool
#: (``kafka-topics.sh --create``) a moment before shows in the metadata a moment after.
TOPIC_WAIT_S = 3.0


def _ladder(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return parse_ladder(text)
    except ValueError as exc:
        raise BindingError(f"retry ladder: {exc}") from exc


def _duration(what: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise BindingError(f"{what}: {exc}") from exc


_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KB|KIB|MB|MIB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"B": 1, "KB": 1000, "KIB": 1024, "MB": 1000**2, "MIB": 1024**2}


def _size(what: str, text: str) -> int:
    """Bytes of a size such as ``4096``, ``512KB`` or ``1MiB``."""
    found = _SIZE_RE.fullmatch(text)
    if found is None:
        raise BindingError(f"{what}: {text!r} is not a size: write bytes, or a number with "
                           "KB, KiB, MB or MiB (512KB, 1MiB)")
    return int(found.group(1)) * _SIZE_UNITS[(found.group(2) or "B").upper()]


@click.command()
@click.argument("name")
@click.option("--topic", help="The Kafka topic to run the function on.")
@click.option("--queue", "queue_topic", help="Or: the queue topic (in the tenant's namespace).")
@click.option("--lease", "lease", default="30s", show_default=True,
              help="--queue (or --topic with long work, see --queue-after): the lease a "
                   "batch's items get (extended while they run).")
@click.option("--function", "function", required=True, help="module:attr of the function.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--priority", type=click.Choice(PRIORITIES), default="normal", show_default=True)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True)
@click.option("--schema", "schema_file", type=click.Path(dir_okay=False),
              help="Avro schema file (JSON) for --format avro; with --schema-registry the "
                   "reader schema every writer version is resolved to.")
@click.option("--schema-registry", "schema_registry", metavar="URL",
              help="The records are framed for this schema registry (its Confluent-"
                   "compatible API); --format avro, jsonschema or protobuf. Credentials and TLS: "
                   "the config's [schema_registry].")
@click.option("--check-schema", is_flag=True,
              help="With --schema-registry and --schema: refuse a reader schema that cannot "
                   "read the latest version of the subject <topic>-value.")
@click.option("--rate", type=float, help="Items per second, across all schedulers.")
@click.option("--burst", type=int, help="Token-bucket burst (default: the rate).")
@click.option("--concurrency", type=int, help="Items of this binding running at once.")
@click.option("--max-attempts", type=int, default=5, show_default=True)
@click.option("--timeout", "timeout", default="30s", show_default=True,
              help="Time limit of one call of the function, up to 1h (30s, 2m...). Past it "
                   "the attempt fails with reason timeout (see --isolation).")
@click.option("--queue-after", "queue_after", default="60s", show_default=True,
              help="--topic: with a --timeout above this, records are moved into a queue "
                   "topic the platform owns (<prefix>.moved.NAME) and run from there with "
                   "leases, so the Kafka offsets are committed at once. --queue: with a "
                   "--timeout above this each item runs alone (long work), under it items "
                   "run in batches.")
@click.option("--isolation", type=click.Choice(ISOLATIONS), default="thread",
              show_default=True,
              help="Sync functions: in worker threads (a call past its timeout is reported "
                   "and keeps its slot until it returns) or in worker processes (a call "
                   "past its timeout is stopped: its process is killed and replaced).")
@click.option("--retry-ladder", help="Delays between attempts [default: 30s,1m,5m,30m].")
@click.option("--idempotent/--not-idempotent", default=False, show_default=True,
              help="Say the function may safely run twice on one record. Otherwise (the "
                   "default) the scheduler remembers each success in Redis for "
                   "run_once_window (15m) and does not run a record read again after a "
                   "crash twice.")
@click.option("--redis-policy", type=click.Choice(["fail_open", "fail_closed"]),
              default="fail_open", show_default=True,
              help="When Redis is down: local limits (fail_open) or pause (fail_closed).")
@click.option("--start-within", help="A record should start this long after its record "
              "time (5s, 1m...): its deadline. Within a tier, earliest deadline first.")
@click.option("--expire-after", help="A record not started this long after its record time "
              "is useless: a dead letter with reason 'expired', never run late.")
@click.option("--defer-when-busy", "defer_when_busy", is_flag=True,
              help="While the schedulers are saturated by other work, park this binding's "
                   "records (no attempt spent) until load falls or their deadline nears. "
                   "Needs --start-within 1h or more.")
@click.option("--breaker", help="Circuit breaker: SHARE%/WINDOW, such as 50%/30s. When that "
              "share of calls fails over the window, new records are parked (no attempt "
              "spent), probes test the downstream, and records flow back at a ramped rate.")
@click.option("--ordering", type=click.Choice(["none", "key"]), default="none",
              show_default=True,
              help="key: records of one key run one at a time, in offset order (a failing "
                   "record parks its key; other keys keep flowing). none: concurrently.")
@click.option("--max-payload", "max_payload", metavar="SIZE",
              help="The largest payload the Submitter accepts (512KB, 1MB; at most 1MiB) "
                   "[default: 1MiB].")
@click.option("--create-topic", type=int, metavar="N",
              help="Create the topic with N partitions when it does not exist.")
@click.pass_context
def bind(ctx: click.Context, name: str, topic: str | None, queue_topic: str | None,
         lease: str, function: str, tenant: str, priority: Priority,
         fmt: PayloadFormat, schema_file: str | None, schema_registry: str | None,
         check_schema: bool, rate: float | None, burst: int | None,
         concurrency: int | None, max_attempts: int, timeout: str, retry_ladder: str | None,
         queue_after: str, isolation: Isolation, idempotent: bool, redis_policy: RedisPolicy,
         start_within: str | None, expire_after: str | None, defer_when_busy: bool,
         breaker: str | None, ordering: Ordering, max_payload: str | None,
         create_topic: int | None) -> None:
    """Bind topic --topic (or queue topic --queue) to function --function under NAME."""
    settings = settings_of(ctx)
    binding = Binding(
        name, _source(topic, queue_topic, lease, queue_after), function, tenant=tenant,
        priority=priority,
        payload=Payload(fmt, _schema(schema_file), schema_registry,
                        None if max_payload is None else _size("max payload", max_payload)),
        limits=Limits(rate_per_s=rate, burst=burst, max_concurrency=concurrency,
                      redis_policy=redis_policy),
        retries=Retries(max_attempts, _ladder(retry_ladder) or DEFAULT_LADDER_S),
        breaker=_breaker_flag(breaker),
        execution=Execution(_duration("timeout", timeout), isolation, idempotent, ordering),
        deadlines=Deadlines(_optional_duration("start within", start_within),
                            _optional_duration("expire after", expire_after),
                            defer_when_busy),
    ).validate()
    _check_bindable(settings, binding)
    if check_schema:
        _check_reader(settings, binding)
    if topic is not None:
        _kafka_topic(settings, topic, create_topic)
    binding = binding.with_changes(created_ms=epoch_ms(),
                                   fresh_from_start=_fresh_from_start(settings, name))
    if topic is not None:
        ensure_binding_topics(settings, [binding])
    BindingRegistry(settings).put(binding)
    order = ", ordered by key" if binding.execution.ordering == "key" else ""
    order += ", deferred when busy" if binding.deadlines.defer_when_busy else ""
    click.echo(f"bound {name}: {path_of(settings, binding)} -> {function} (tenant {tenant}, "
               f"{priority}, ladder {','.join(binding.retries.ladder_names)}{order})")


def _source(topic: str | None, queue_topic: str | None, lease: str, queue_after: str) -> Source:
    """``--topic`` or ``--queue``, one of them, with ``--lease`` and ``--queue-after``."""
    if (topic is None) == (queue_topic is None):
        raise BindingError("source: give --topic T (a Kafka topic) or --queue Q (a queue "
                           "topic), one of them")
    return Source("kafka" if queue_topic is None else "queue", topic or queue_topic or "",
                  _duration("lease", lease), _duration("queue after", queue_after))


def _check_reader(settings: Settings, binding: Binding) -> None:
    """``--check-schema``: the reader schema reads the subject's latest version."""
    payload = binding.payload
    if payload.schema_registry is None or payload.schema is None or payload.format != "avro":
        raise BindingError("schema: --check-schema checks an Avro reader schema: give "
                           "--format avro, --schema FILE and --schema-registry URL")
    check_reader_schema(payload.schema_registry, binding.source.topic, payload.schema,
                        RegistryClients(settings.schema_registry))


def _schema(path: str | None) -> str | None:
    """The text of the schema file ``--schema`` names."""
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise BindingError(f"schema: cannot read {path}: {exc.strerror}") from exc


def _optional_duration(what: str, text: str | None) -> float | None:
    return None if text is None else _duration(what, text)


def _breaker_flag(text: str | None) -> Breaker:
    """The breaker ``--breaker`` asks for; none (the default window) without the flag."""
    if text is None:
        return Breaker()
    try:
        return Breaker(*parse_breaker(text))
    except ValueError as exc:
        raise BindingError(f"breaker: {exc}") from exc


def _fresh_from_start(settings: Settings, name: str) -> bool:
    """Whether a partition of the binding without a sent mark was never sent from: true of
    a new binding, kept from the one it replaces (one bound before the marks stays false:
    its tailers may have sent records without raising a mark)."""
    earlier = BindingRegistry(settings).load().get(name)
    return earlier is None or earlier.fresh_from_start


def _check_bindable(settings: Settings, binding: Binding) -> None:
    """What a binding valid on its own still needs from this platform: an allowed module,
    and a queue shard when its records run from the queue."""
    try:
        check_function_allowed(binding.function, settings.allow_modules or None)
    except ModuleNotAllowed as exc:
        raise BindingError(f"function: {exc}") from exc
    if binding.moved_to_queue and not settings.queue_shards:
        raise BindingError(
            f"timeout: {binding.execution.timeout_s:g}s is above --queue-after "
            f"{binding.source.queue_after_s:g}s, so the records run from the queue, and no "
            "queue shard is configured: set [queue] shards (ASYNCTIER_QUEUE_SHARDS), or raise "
            "--queue-after")


def path_of(settings: Settings, binding: Binding) -> str:
    """Where a binding's records run from: its topic, its queue topic, or its topic moved
    into the platform's queue topic (a long timeout)."""
    if binding.source.kind == "queue":
        return f"queue {binding.tenant}/{binding.source.topic}"
    if binding.moved_to_queue:
        return (f"{binding.source.topic} -> queue {binding.tenant}/"
                f"{settings.names.moved_topic(binding.name)}")
    return binding.source.topic


def _kafka_topic(settings: Settings, topic: str, create_topic: int | None) -> None:
    """Make sure the Kafka topic exists (created with --create-topic N)."""
    client = admin(settings)
    if topic_partitions(client, topic, wait_s=TOPIC_WAIT_S) is None:
        if create_topic is None:
            raise BindingError(f"topic: {topic!r} does not exist; create it first or pass "
                               "--create-topic N")
        if not 1 <= create_topic <= 1000:
            raise BindingError("create-topic: give 1 to 1000 partitions")
        ensure_topics(client, {topic: (create_topic, {})},
                      replication=topic_replication(settings))


@click.command()
@click.argument("name")
@click.pass_context
def unbind(ctx: click.Context, name: str) -> None:
    """Remove binding NAME; its tailer stops after its in-flight batch."""
    BindingRegistry(settings_of(ctx)).delete(name)
    click.echo(f"unbound {name}")


@click.command()
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    """Pause binding NAME: its tailer stops after its in-flight batch (within a second or
    two) and its records wait in its topic or queue, retries on its ladder included, until
    `asynctier resume NAME`. Producing and submitting go on."""
    settings = settings_of(ctx)
    check_bound(settings, name)
    set_paused(settings, name, True, by=f"cli:{os.environ.get('USER', 'unknown')}")
    click.echo(f"paused {name}: its records wait until `asynctier resume {name}`")


@click.command()
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Resume binding NAME: its tailer starts again from its committed offsets."""
    settings = settings_of(ctx)
    check_bound(settings, name)
    if set_paused(settings, name, False, by=""):
        click.echo(f"resumed {name}")
    else:
        click.echo(f"{name} was not paused")


def check_bound(settings: Settings, name: str) -> None:
    """BindingError unless binding ``name`` exists."""
    if name not in BindingRegistry(settings).load():
        raise BindingError(f"no binding {name!r} (`asynctier bindings` lists them)")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for scripts.")
@click.pass_context
def bindings(ctx: click.Context, as_json: bool) -> None:
    """List the bindings, with their tailers' state: running, paused (`asynctier
    resume`), restarting: ERROR, failing: ERROR (it keeps failing: 5 restarts in 5
    minutes), not running (no tailer process runs it), unknown (Redis does not answer)."""
    settings = settings_of(ctx)
    found = BindingRegistry(settings).load()
    states = breaker_states(settings, [b.name for b in found.values()
                                       if b.breaker.ratio is not None])
    tailers = {row.name: row.status for row in read_tailers(settings, list(found.values()))}
    if as_json:
        click.echo(json.dumps([{**b.to_json(), "path": path_of(settings, b),
                                "breaker_state": states.get(b.name),
                                "tailer": tailers.get(b.name)}
                               for b in found.values()], indent=2))
        return
    table = Table("name", "source", "function", "tenant", "priority", "format", "rate",
                  "concurrency", "attempts", "timeout", "isolation", "ladder",
                  "start/expire", "breaker", "tailer")
    for b in sorted(found.values(), key=lambda b: b.name):
        status = tailers.get(b.name, "")
        table.add_row(b.name, path_of(settings, b), b.function, b.tenant, b.priority,
                      b.payload.format, _rate(b.limits), str(b.limits.max_concurrency or "-"),
                      str(b.retries.max_attempts), f"{b.execution.timeout_s:g}s",
                      b.execution.isolation, ",".join(b.retries.ladder_names), _deadlines(b),
                      _breaker(b, states),
                      status if status in ("running", "paused")
                      else f"[red]{escape(status)}[/red]")
    Console().print(table)


def breaker_states(settings: Settings, names: list[str]) -> dict[str, str]:
    """The shared breaker state of each binding named (``unknown`` while Redis does not
    answer)."""
    if not names:
        return {}
    import asyncio

    from asynctier.platform.redis_client import async_client
    from asynctier.scheduler.limits.breaker import read_states

    async def read() -> dict[str, str]:
        client = async_client(settings.redis_url, socket_timeout=2.0,
                                socket_connect_timeout=2.0)
        try:
            return await read_states(client, settings.names, names)
        finally:
            await client.aclose()

    try:
        return asyncio.run(read())
    except Exception:  # redis down: the table still shows the bindings
        return dict.fromkeys(names, "unknown")


def _rate(limits: Limits) -> str:
    return "-" if limits.rate_per_s is None else f"{limits.rate_per_s:g}/s"


def _breaker(b: Binding, states: dict[str, str]) -> str:
    if b.breaker.ratio is None:
        return "-"
    return (f"{b.breaker.ratio:.0%}/{format_duration(b.breaker.window_s)} "
            f"{states.get(b.name, 'closed')}")


def _deadlines(b: Binding) -> str:
    """``start within / expire after`` of a binding, ``-`` for what it does not set."""
    def shown(s: float | None) -> str:
        return "-" if s is None else format_duration(s)
    within, expire = b.deadlines.start_within_s, b.deadlines.expire_after_s
    if within is None and expire is None:
        return "-"
    defer = " defer" if b.deadlines.defer_when_busy else ""
    return f"{shown(within)}/{shown(expire)}{defer}"


COMMANDS = [bind, unbind, bindings, pause, resume]
