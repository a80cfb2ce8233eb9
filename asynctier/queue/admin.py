"""What the queue's CLI does, as library functions: enqueue JSON lines, replay at a rate.

``enqueue_lines`` refuses bad lines, not the batch: a line that is not JSON, too large,
or with a bad id or priority is refused with its line number and the reason, every other
line is enqueued, and the report lists both (the CLI exits 1 when any line was refused).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from asynctier.platform.errors import QueueError
from asynctier.queue.items import NewItem, check_new_item, check_topic
from asynctier.queue.shards import ShardedQueue

#: Lines per enqueue statement.
ENQUEUE_BATCH = 1000
#: The most dead items one replay statement moves.
REPLAY_BATCH = 1000


@dataclass
class EnqueueReport:
    """What ``enqueue_lines`` did: items created, ids already there, lines refused."""

    created: int = 0
    existing: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class LineOptions:
    """How each line becomes an item: its priority, delay, where its id comes from, and
    the parents it waits for (``after``, and the ids in each line's ``after_field``, all
    of ``after_topic``: the item's own topic when None)."""

    topic: str
    priority: int = 0
    delay_s: float | None = None
    id_field: str | None = None
    after: tuple[str, ...] = ()
    after_topic: str | None = None
    after_field: str | None = None
    on_parent_failure: str = "fail"


def line_item(number: int, line: str, options: LineOptions) -> NewItem:
    """The item of one JSON line (its JSON text is the payload); QueueError says why not."""
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise QueueError(f"line {number} is not JSON ({exc.msg})") from exc
    item_id = None
    if options.id_field:
        value = doc.get(options.id_field) if isinstance(doc, dict) else None
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise QueueError(f"line {number} has no string or integer field "
                             f"{options.id_field!r} to take its id from")
        item_id = str(value)
    parents = [*options.after, *_line_parents(number, doc, options.after_field)]
    item = NewItem(options.topic, line.strip().encode(), id=item_id,
                   priority=options.priority, delay_s=options.delay_s,
                   after=[(options.after_topic or options.topic, p) for p in parents],
                   on_parent_failure=options.on_parent_failure)
    try:
        check_new_item(item, number)
    except QueueError as exc:
        raise QueueError(f"line {number}: {str(exc).split(': ', 1)[-1]}") from exc
    return item


def _line_parents(number: int, doc: object, field: str | None) -> list[str]:
    """The parent ids a line names in ``field`` (a list of ids, or one); none without."""
    if field is None or not isinstance(doc, dict) or field not in doc:
        return []
    value = doc[field]
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
        raise QueueError(f"line {number}: field {field!r} is not an id or a list of ids")
    return [str(v) for v in values]


def parse_lines(lines: Iterable[str], options: LineOptions,
                refused: list[tuple[int, str]]) -> Iterator[NewItem]:
    """The items of the good lines; each bad line is added to ``refused`` instead."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield line_item(number, line, options)
        except QueueError as exc:
            refused.append((number, str(exc)))


def enqueue_lines(queue: ShardedQueue, namespace: str, lines: Iterable[str],
                  options: LineOptions, batch_size: int = ENQUEUE_BATCH,
                  tick: Callable[[EnqueueReport], None] | None = None) -> EnqueueReport:
    """Enqueue each good JSON line as one item, ``batch_size`` per statement."""
    check_topic(options.topic)
    report = EnqueueReport()
    batch: list[NewItem] = []
    for item in parse_lines(lines, options, report.refused):
        batch.append(item)
        if len(batch) >= batch_size:
            _send(queue, namespace, batch, report, tick)
    if batch:
        _send(queue, namespace, batch, report, tick)
    return report


def _send(queue: ShardedQueue, namespace: str, batch: list[NewItem], report: EnqueueReport,
          tick: Callable[[EnqueueReport], None] | None) -> None:
    results = queue.enqueue(namespace, batch)
    created = sum(1 for r in results if r.created)
    report.created += created
    report.existing += len(results) - created
    batch.clear()
    if tick is not None:
        tick(report)


def replay_at_rate(queue: ShardedQueue, namespace: str, topic: str, limit: int | None = None,
                   rate_per_s: float | None = None,
                   sleep: Callable[[float], None] = time.sleep) -> int:
    """Move dead items back to ready, at most ``rate_per_s`` a second (one statement per
    second's worth) and ``limit`` in all; returns how many."""
    done = 0
    per_call = REPLAY_BATCH if rate_per_s is None else max(1, min(REPLAY_BATCH,
                                                                   int(rate_per_s)))
    while limit is None or done < limit:
        want = per_call if limit is None else min(per_call, limit - done)
        started = time.monotonic()
        moved = queue.replay(namespace, topic, want)
        done += moved
        if moved < want:
            break
        if rate_per_s is not None:
            sleep(max(0.0, moved / rate_per_s - (time.monotonic() - started)))
    return done
