"""``asynctier produce TOPIC < records.jsonl``: JSON lines in, records out, delivery confirmed."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO

import click

from asynctier.cli import settings_of
from asynctier.cli.progress import progress
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError
from asynctier.platform.kafka import ConfirmingProducer


def produce_lines(settings: Settings, topic: str, lines: IO[str], key_field: str | None,
                  confirm_every: int = 10_000) -> int:
    """Produce each JSON line as one record (key from ``key_field`` when given).

    A line that is not JSON stops the run with its line number: nothing after it is sent,
    everything before it is confirmed.
    """
    producer = ConfirmingProducer(settings)
    with progress() as bar:
        task = bar.add_task(f"producing to {topic}", total=None)
        count = _produce_all(producer, topic, lines, key_field, confirm_every,
                             lambda n: bar.update(task, completed=n))
    producer.confirm()
    return count


def _produce_all(producer: ConfirmingProducer, topic: str, lines: IO[str],
                 key_field: str | None, confirm_every: int,
                 tick: Callable[[int], None]) -> int:
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
        producer.produce(topic, line.strip().encode(), key)
        count += 1
        if count % confirm_every == 0:
            producer.confirm()
            tick(count)
    return count


@click.command()
@click.argument("topic")
@click.option("--key", "key_field", default="key", show_default=True,
              help="JSON field whose value becomes the record key (when present).")
@click.pass_context
def produce(ctx: click.Context, topic: str, key_field: str) -> None:
    """Produce JSON lines from stdin to TOPIC, with delivery confirmed."""
    count = produce_lines(settings_of(ctx), topic, sys.stdin, key_field or None)
    click.echo(f"produced {count} record(s) to {topic}, all confirmed", err=True)


COMMANDS = [produce]
