"""``asynctier submit BINDING < workloads.jsonl``: workloads through the Submitters.

Each non-empty line is one workload's payload, sent as it is (the Submitter checks it
against the binding's format). With ``--envelope`` each line is a JSON object
``{"payload": ..., "id": ..., "priority": ..., "delay": seconds, "key": "...",
"after": [id or [topic, id], ...], "on_parent_failure": "fail" or "run"}`` whose
``payload`` (a string is sent as its UTF-8, anything else as JSON) is the workload. The
summary counts accepted, duplicate, invalid (with line numbers) and throttled workloads;
it exits 1 when any was invalid or left throttled. ``asynctier enqueue`` and ``asynctier
produce`` still write directly.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import click

from asynctier.cli import settings_of
from asynctier.client import Client, SubmitError, as_payload, parent_refs
from asynctier.submitter.protocol import Result, Workload

#: Lines sent per batch of calls (and per step of the progress bar).
CHUNK = 1000
#: Inputs of at least this many lines show a progress bar (on a terminal's stderr).
PROGRESS_FROM = 10_000


def _envelope(line: str, number: int) -> Workload:
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise click.UsageError(f"line {number}: not JSON ({exc}); with --envelope each line "
                               'is {"payload": ..., "id": ...}') from exc
    if not isinstance(doc, dict) or "payload" not in doc:
        raise click.UsageError(f'line {number}: give an object with a "payload" field')
    delay = doc.get("delay")
    key = doc.get("key")
    after = doc.get("after", [])
    if not isinstance(after, list) or not all(
            isinstance(p, str) or (isinstance(p, list) and len(p) == 2
                                   and all(isinstance(x, str) for x in p)) for p in after):
        raise click.UsageError(f'line {number}: "after" is a list of ids, or of [topic, id]')
    opf = doc.get("on_parent_failure")
    if opf not in (None, "fail", "run"):
        raise click.UsageError(f'line {number}: "on_parent_failure" is "fail" or "run"')
    return Workload(as_payload(doc["payload"]), None if key is None else str(key).encode(),
                    (), doc.get("priority"), None if delay is None else round(delay * 1000),
                    doc.get("id"), parent_refs(p if isinstance(p, str) else (p[0], p[1])
                                               for p in after), opf)


def _summary(results: list[Result], lines: list[int]) -> tuple[str, bool]:
    counts = Counter(r.status for r in results)
    out = [f"{counts['accepted']} accepted, {counts['duplicate']} duplicate, "
           f"{counts['invalid']} invalid, {counts['throttled']} throttled"]
    bad = [r for r in results if r.status in ("invalid", "throttled")]
    for r in bad[:20]:
        out.append(f"  line {lines[r.position]}: {r.status}: {r.reason}")
    if len(bad) > 20:
        out.append(f"  ... and {len(bad) - 20} more")
    return "\n".join(out), not bad


@click.command()
@click.argument("binding")
@click.option("--envelope", is_flag=True,
              help='Each line is {"payload": ..., "id", "priority", "delay", "key", "after", '
                   '"on_parent_failure"}.')
@click.option("--priority", type=int, help="The priority of every workload (queue bindings).")
@click.option("--deadline", type=float, default=300.0, show_default=True,
              help="Seconds to keep sending throttled workloads again.")
@click.pass_context
def submit(ctx: click.Context, binding: str, envelope: bool, priority: int | None,
           deadline: float) -> None:
    """Submit the JSON lines of stdin to BINDING through the Submitters."""
    settings = settings_of(ctx)
    workloads: list[Workload] = []
    lines: list[int] = []
    for number, raw in enumerate(sys.stdin, 1):
        line = raw.strip()
        if not line:
            continue
        lines.append(number)
        workloads.append(_envelope(line, number) if envelope
                         else Workload(line.encode(), priority=priority))
    results: list[Result] = []
    with Client.from_settings(settings, deadline_s=deadline) as client:
        chunks = range(0, len(workloads), CHUNK)
        with click.progressbar(chunks, label="submitting", file=sys.stderr,
                               hidden=len(workloads) < PROGRESS_FROM) as bar:
            for at in bar:
                try:
                    got = client.submit_many(binding, workloads[at:at + CHUNK])
                except SubmitError as exc:
                    raise click.ClickException(f"{exc} ({len(results)} of "
                                               f"{len(workloads)} answered before)") from exc
                results += [_shift(r, at) for r in got]
    text, clean = _summary(results, lines)
    click.echo(text)
    if not clean:
        ctx.exit(1)


def _shift(r: Result, by: int) -> Any:
    return Result(r.status, r.position + by, r.id, r.topic, r.partition, r.offset, r.reason,
                  r.retry_after_ms)


COMMANDS = [submit]
