"""``asynctier dev up | down | status | reset | env | fetch | certs``: the local Kafka, Redis and
PostgreSQL."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from asynctier.cli import settings_of
from asynctier.dev import (
    DevStack,
    KafkaJars,
    postgres_answers,
    redis_answers,
    registry_answers,
    round_trip,
)


def _stack_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options every ``dev`` command shares, each with its environment variable."""
    options = [
        click.option("--kafka-port", type=int, envvar="ASYNCTIER_DEV_KAFKA_PORT",
                     help="Kafka's port (default 9092, or the last `dev up`'s) "
                          "[env ASYNCTIER_DEV_KAFKA_PORT]."),
        click.option("--controller-port", type=int, envvar="ASYNCTIER_DEV_CONTROLLER_PORT",
                     help="The KRaft controller's port (default 9093) "
                          "[env ASYNCTIER_DEV_CONTROLLER_PORT]."),
        click.option("--redis-port", type=int, envvar="ASYNCTIER_DEV_REDIS_PORT",
                     help="Redis's port (default 6379) [env ASYNCTIER_DEV_REDIS_PORT]."),
        click.option("--postgres-port", type=int, envvar="ASYNCTIER_DEV_POSTGRES_PORT",
                     help="PostgreSQL's port (default 5432, a free one when 5432 is taken, "
                          "or the last `dev up`'s) [env ASYNCTIER_DEV_POSTGRES_PORT]."),
        click.option("--registry-port", type=int, envvar="ASYNCTIER_DEV_REGISTRY_PORT",
                     help="The schema registry's port (default 8081, a free one when it is "
                          "taken, or the last `dev up`'s) [env ASYNCTIER_DEV_REGISTRY_PORT]."),
        click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
                     envvar="ASYNCTIER_DATA_DIR",
                     help="Where the data is kept (default: the config's data_dir, "
                          ".asynctier) [env ASYNCTIER_DATA_DIR]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _stack(ctx: click.Context, kafka_port: int | None, controller_port: int | None,
           redis_port: int | None, postgres_port: int | None, registry_port: int | None,
           data_dir: Path | None) -> DevStack:
    return DevStack.resolve(data_dir or settings_of(ctx).data_dir, kafka_port,
                            controller_port, redis_port, postgres_port, registry_port)


def _with_stack(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the shared options into one ``stack`` argument."""

    @functools.wraps(fn)
    def wrapper(kafka_port: int | None, controller_port: int | None,
                redis_port: int | None, postgres_port: int | None,
                registry_port: int | None, data_dir: Path | None, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        return fn(_stack(ctx, kafka_port, controller_port, redis_port, postgres_port,
                         registry_port, data_dir), **kwargs)

    return _stack_options(wrapper)


@click.group()
def dev() -> None:
    """A local Kafka (KRaft), Redis, PostgreSQL and schema registry for development, data
    kept in .asynctier/."""


@dev.command()
@click.option("--with", "extras", type=click.Choice(["tracing"]), multiple=True,
              help="tracing: Jaeger too (OTLP on 4317, its UI on 16686), built by Go the "
                   "first time.")
@_with_stack
def up(stack: DevStack, extras: tuple[str, ...]) -> None:
    """Start Kafka, Redis, PostgreSQL and the schema registry; return once all answer."""
    for status in stack.up(tracing="tracing" in extras):
        click.echo(status.describe())
    for line in stack.env_lines():
        click.echo(line)


@dev.command()
@_with_stack
def down(stack: DevStack) -> None:
    """Stop Kafka, Redis, PostgreSQL and the registry (a clean shutdown); the data is
    kept."""
    for name, was_running in stack.down():
        click.echo(f"{name:<6} {'stopped' if was_running else 'was not running'}")


@dev.command()
@_with_stack
def status(stack: DevStack) -> None:
    """Say whether each answers; exit 0 only when all are healthy."""
    statuses = stack.status()
    for st in statuses:
        click.echo(st.describe())
    if not all(st.healthy for st in statuses):
        raise SystemExit(1)


@dev.command()
@click.option("--yes", is_flag=True, help="Do not ask.")
@_with_stack
def reset(stack: DevStack, yes: bool) -> None:
    """Stop each and wipe the data folder (asks first unless --yes)."""
    if not yes:
        click.confirm(f"Delete every topic, offset, key and queue item in {stack.data_dir}?",
                      abort=True)
    stack.reset()
    click.echo(f"wiped {stack.data_dir}")


@dev.command()
@_with_stack
def env(stack: DevStack) -> None:
    """Print the export lines that point a shell at the local stack."""
    for line in stack.env_lines():
        click.echo(line)


@dev.command()
@_with_stack
def check(stack: DevStack) -> None:
    """Prove the stack works: a produce/consume round trip through Kafka, a Redis PING, a
    PostgreSQL query, the registry's subjects."""
    offset = round_trip(stack.kafka.bootstrap)
    click.echo(f"kafka  {stack.kafka.bootstrap}: produced and consumed a record "
               f"(asynctier.devcheck, offset {offset})")
    if not redis_answers(stack.redis.url):
        raise SystemExit(f"redis  {stack.redis.address}: no answer to PING")
    click.echo(f"redis  {stack.redis.address}: PING answered")
    if not postgres_answers(stack.postgres.dsn):
        raise SystemExit(f"postgres {stack.postgres.address}: no answer to SELECT 1")
    click.echo(f"postgres {stack.postgres.address}: SELECT 1 answered")
    if not registry_answers(stack.registry.url):
        raise SystemExit(f"registry {stack.registry.address}: no answer from {stack.registry.url}")
    click.echo(f"registry {stack.registry.address}: its subjects listed")


@dev.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder to write ca.pem, server.pem, server-key.pem, client.pem and "
                   "client-key.pem to (created).")
@click.option("--host", "hosts", multiple=True,
              help="Another name or IP the server certificate is valid for (repeatable); "
                   "localhost, 127.0.0.1, ::1 and this machine's name always are.")
def certs(out: Path, hosts: tuple[str, ...]) -> None:
    """Write a new CA and a server and a client certificate to try TLS with (development
    only: the CA's key is not kept)."""
    from asynctier.dev.certs import write_certs

    files = write_certs(out, hosts)
    click.echo(f"wrote {files.ca}, {files.server}, {files.server_key}, {files.client}, "
               f"{files.client_key}")
    click.echo("scheduler / Submitter asynctier.toml:\n  [rpc]\n"
               f'  ca = "{files.ca}"\n  cert = "{files.server}"\n  key = "{files.server_key}"')
    click.echo("tailers / clients:\n  [rpc]\n"
               f'  ca = "{files.ca}"\n  cert = "{files.client}"\n  key = "{files.client_key}"')


@dev.command()
def fetch() -> None:
    """Fetch Kafka's jars with Maven into the cache (done by `up` when needed)."""
    click.echo(f"Kafka jars ready in {KafkaJars().ensure()}")


COMMANDS = [dev]
