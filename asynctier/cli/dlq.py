"""``asynctier dlq list | show | replay | purge BINDING``: inspect, replay and delete dead
letters."""

from __future__ import annotations

import json
import math
import sys
import threading
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.delay_streams.dlq import (
    LetterFilter,
    ReplayOptions,
    ReplayReport,
    list_dead_letters,
    purge_dead_letters,
    replay,
    show_dead_letter,
)
from asynctier.platform.config import Settings
from asynctier.platform.errors import DecodeError
from asynctier.platform.framed import RegistryClients
from asynctier.platform.membership import default_client
from asynctier.platform.payloads import decoder_for
from asynctier.platform.registry import BindingRegistry


@click.group()
def dlq() -> None:
    """Dead letters: list them, show one, replay them after a fix, delete them."""


@dlq.command("list")
@click.argument("binding")
@click.option("--limit", type=int, help="Show at most N (oldest first).")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_context
def list_(ctx: click.Context, binding: str, limit: int | None, as_json: bool) -> None:
    """Offset, key, attempts, first seen, reason and last error of each dead letter."""
    rows = [letter.summary() for letter in list_dead_letters(settings_of(ctx), binding, limit)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("offset", "key", "attempts", "first seen", "reason", "last error")
    for row in rows:
        table.add_row(str(row["offset"]), row["key"] or "", str(row["attempts"]),
                      row["first_seen"], row["reason"], _short(row["error"], 80))
    Console(soft_wrap=not sys.stdout.isatty()).print(table)
    click.echo(f"{len(rows)} dead letter(s) of binding {binding}")


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


#: ``dlq show`` prints at most this much of a value as text (``--raw`` and ``--json`` give it
#: whole): a dead letter may be up to 64 MB.
SHOW_VALUE_CHARS = 4096


@dlq.command()
@click.argument("binding")
@click.argument("offset", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, the value whole.")
@click.option("--raw", is_flag=True,
              help="Only the value's bytes, as they are (for example `--raw > record.bin`).")
@click.pass_context
def show(ctx: click.Context, binding: str, offset: int, as_json: bool, raw: bool) -> None:
    """Every header and the value of one dead letter (text when UTF-8, else base64; the
    first 4,096 characters of a longer value)."""
    if as_json and raw:
        raise click.UsageError("--json and --raw are two ways to print it: give one of them")
    settings = settings_of(ctx)
    letter = show_dead_letter(settings, binding, offset)
    if raw:
        click.echo(letter.value or b"", nl=False)
        return
    doc = letter.detail()
    decoded = _decoded(settings, binding, letter.value)
    if decoded is not None:
        doc["decoded"] = decoded
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for name in ("offset", "key", "attempts", "first_seen", "dead_lettered", "reason",
                 "origin", "trace", "error"):
        click.echo(f"{name + ':':15} {doc[name]}")
    click.echo("headers:")
    for header in doc["headers"]:
        click.echo(f"  {header['name']}: {header['value']}")
    if decoded is not None:
        click.echo(f"decoded:       {decoded}")
    value = doc["value"]
    size = len(letter.value or b"")
    click.echo(f"value ({doc['value_encoding']}, {size:,} bytes):")
    if value is None:
        click.echo("(null)")
    elif len(value) <= SHOW_VALUE_CHARS:
        click.echo(value)
    else:
        click.echo(value[:SHOW_VALUE_CHARS])
        click.echo(f"... the first {SHOW_VALUE_CHARS:,} of {len(value):,} characters: "
                   f"`asynctier dlq show {binding} {offset} --raw` prints the value whole "
                   "(or --json)")


def _decoded(settings: Settings, name: str, value: bytes | None) -> Any:
    """A registry-framed binding's payload decoded for display (its writer schema, or the
    binding's reader schema), or why it does not decode; None for other bindings."""
    binding = BindingRegistry(settings).load().get(name)
    if binding is None or binding.payload.schema_registry is None:
        return None
    decode = decoder_for(binding, RegistryClients(settings.schema_registry))
    try:
        return json.loads(json.dumps(decode(value), default=repr))
    except DecodeError as exc:
        return f"({exc.reason}: {exc})"


@dlq.command()
@click.argument("binding")
@click.option("--all", "everything", is_flag=True,
              help="Every dead letter, replayed or not (asks for --yes).")
@click.option("--yes", is_flag=True, help="Yes, delete them all (with --all).")
@click.pass_context
def purge(ctx: click.Context, binding: str, everything: bool, yes: bool) -> None:
    """Delete the dead letters a bulk replay has passed (before the replay position), or
    with --all --yes every one. Kafka deletes up to an offset: a dead letter after one
    never replayed is kept."""
    if everything and not yes:
        raise click.UsageError("--all deletes dead letters never replayed too: add --yes")
    done = purge_dead_letters(settings_of(ctx), binding, everything)
    click.echo(f"deleted {done.deleted} dead letter(s) of {binding}; {done.kept} kept "
               f"(from offset {done.first_kept})")


@dlq.command("replay")
@click.argument("binding")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True, max=1_000_000),
              help="About N records a second at most (each call carries one second's).")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most N records.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; change nothing.")
@click.option("--canary", type=click.IntRange(min=0), default=0,
              help="Replay K first; go on only if all succeed.")
@click.option("--from-start", is_flag=True,
              help="Start from the first dead letter, even the ones already replayed.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--max-failure-ratio", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Stop when this share of the last --window replays "
                                      "failed.")
@click.option("--window", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--offset", "offsets", type=click.IntRange(min=0), multiple=True,
              help="Only the dead letter at this offset; repeatable.")
@click.option("--reason", default="", help="Only the dead letters of this reason.")
@click.option("--error", "error_text", default="",
              help="Only the dead letters whose last error holds this text (any case).")
@click.pass_context
def replay_(ctx: click.Context, binding: str, rate: float | None, limit: int | None,
            dry_run: bool, canary: int, from_start: bool, batch_size: int,
            max_failure_ratio: float, window: int, offsets: tuple[int, ...], reason: str,
            error_text: str) -> None:
    """Run the dead letters again (attempt 1, fresh ladder); failures go back through the
    ladder. A second replay does not redo what an earlier one replayed (see --from-start).
    With --offset, --reason or --error only those are replayed, and the replay position
    stays where it was."""
    if rate is not None and not math.isfinite(rate):
        raise click.BadParameter(f"{rate} is not a rate: give a number of records a second",
                                 param_hint="'--rate'")
    settings = settings_of(ctx)
    options = ReplayOptions(rate_per_s=rate, limit=limit, dry_run=dry_run, canary=canary,
                            from_start=from_start, batch_size=batch_size, window=window,
                            max_failure_ratio=max_failure_ratio,
                            only=LetterFilter(reason=reason, error=error_text,
                                              offsets=frozenset(offsets)))
    client = None if dry_run else default_client(settings, wait_for_scheduler=False)
    try:
        report = _with_progress(lambda progress: replay(
            settings, binding, options, client, threading.Event(), progress))
    finally:
        if client is not None:
            client.close()
    _summary(binding, report, dry_run)
    if report.stopped:
        sys.exit(1)


def _with_progress(run: Any) -> ReplayReport:
    console = Console(stderr=True)
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
               TextColumn("ok {task.fields[ok]}  failed {task.fields[bad]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("replay", total=None, ok=0, bad=0)

        def progress(report: ReplayReport) -> None:
            bar.update(task, total=report.planned, completed=report.replayed, ok=report.ok,
                       bad=report.retried + report.dead_lettered)

        result: ReplayReport = run(progress)
        return result


def _summary(binding: str, report: ReplayReport, dry_run: bool) -> None:
    span = f"offsets {report.start_offset} to {report.end_offset - 1}" if report.planned \
        else "nothing"
    if dry_run:
        click.echo(f"dry run: would replay {report.planned} dead letter(s) of {binding} "
                   f"({span})")
        return
    click.echo(f"replayed {report.replayed} of {report.planned} dead letter(s) of {binding} "
               f"({span}): {report.ok} ok, {report.retried} retried, "
               f"{report.dead_lettered} dead-lettered again; next replay starts at offset "
               f"{report.next_offset}")
    if report.stopped:
        click.echo(f"stopped: {report.stopped}", err=True)


COMMANDS = [dlq]
