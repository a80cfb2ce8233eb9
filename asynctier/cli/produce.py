"""``asynctier produce TOPIC < records.jsonl``: JSON lines in, records out, delivery confirmed
(each line as it is, or framed for a schema registry with ``--schema-registry``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO

import click

from asynctier.cli import settings_of
from asynctier.cli.progress import progress
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, BindingError
from asynctier.platform.framed import FRAMED_FORMATS, RegistryClients, framed_encoder
from asynctier.platform.kafka import ConfirmingProducer

Encode = Callable[[object], bytes]


def produce_lines(settings: Settings, topic: str, lines: IO[str], key_field: str | None,
                  confirm_every: int = 10_000, encode: Encode | None = None) -> int:
    """Produce each JSON line as one record (key from ``key_field`` when given), as it is
    or as ``encode`` makes it of the parsed document.

    A line that is not JSON (or that ``encode`` refuses) stops the run with its line
    number: nothing after it is sent, everything before it is confirmed.
    """
    producer = ConfirmingProducer(settings)
    with progress() as bar:
        task = bar.add_task(f"producing to {topic}", total=None)
        count = _produce_all(producer, topic, lines, key_field, confirm_every,
                             lambda n: bar.update(task, completed=n), encode)
    producer.confirm()
    return count


def _produce_all(producer: ConfirmingProducer, topic: str, lines: IO[str],
                 key_field: str | None, confirm_every: int,
                 tick: Callable[[int], None], encode: Encode | None = None) -> int:
    count = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            producer.confirm()
            raise AsynctierError(f"line {number} is not JSON ({exc.msg}); {count} record(s) "
                                 "before it were produced and confirmed") from exc
        key = None
        if key_field and isinstance(doc, dict) and key_field in doc:
            key = str(doc[key_field]).encode()
        try:
            value = line.strip().encode() if encode is None else encode(doc)
        except Exception as exc:  # the serializers raise many kinds
            producer.confirm()
            raise AsynctierError(f"line {number} does not fit the schema ({exc}); {count} "
                                 "record(s) before it were produced and confirmed") from exc
        producer.produce(topic, value, key)
        count += 1
        if count % confirm_every == 0:
            producer.confirm()
            tick(count)
    return count


@click.command()
@click.argument("topic")
@click.option("--key", "key_field", default="key", show_default=True,
              help="JSON field whose value becomes the record key (when present).")
@click.option("--schema-registry", "registry", metavar="URL",
              help="Frame each line for this schema registry (its Confluent-compatible "
                   "API), written with --schema; credentials: the config's "
                   "[schema_registry].")
@click.option("--schema", "schema_file", type=click.File("rb"),
              help="The writer schema (an Avro schema, a JSON Schema with --format "
                   "jsonschema, a descriptor set of protoc --include_imports "
                   "--descriptor_set_out with --format protobuf), registered under the "
                   "subject <TOPIC>-value.")
@click.option("--format", "fmt", type=click.Choice(FRAMED_FORMATS), default="avro",
              show_default=True, help="The framed format (with --schema-registry).")
@click.option("--message", help="--format protobuf: the message of the descriptor set each "
                                "line is (a full name such as shop.Order).")
@click.option("--register", is_flag=True,
              help="Register the schema under the subject when it is not there yet.")
@click.pass_context
def produce(ctx: click.Context, topic: str, key_field: str, registry: str | None,
            schema_file: IO[bytes] | None, fmt: str, message: str | None,
            register: bool) -> None:
    """Produce JSON lines from stdin to TOPIC, with delivery confirmed."""
    settings = settings_of(ctx)
    encode = None
    if (registry is None) != (schema_file is None):
        raise BindingError("schema: --schema-registry URL and --schema FILE go together")
    if message is not None and fmt != "protobuf":
        raise BindingError("schema: --message is for --format protobuf")
    if registry is not None and schema_file is not None:
        encode = framed_encoder(fmt, registry, topic, schema_file.read(),
                                RegistryClients(settings.schema_registry), register, message)
    count = produce_lines(settings, topic, sys.stdin, key_field or None, encode=encode)
    click.echo(f"produced {count} record(s) to {topic}, all confirmed", err=True)


COMMANDS = [produce]
