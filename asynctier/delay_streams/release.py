"""Sending records that left a delay or dead-letter topic back to the scheduler.

Shared by the delay tailers and ``dlq replay``: build the wire Items, submit the batch as
one call, and hand off every outcome that is not a success through :class:`Handoff`,
retrying the hand-off until the broker confirmed every record (or the process stops).
The caller commits only after :func:`hand_off` returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.errors import HandoffError
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.wire import Item, Outcome

log = logging.getLogger(__name__)

#: One write to a delay or dead-letter topic; returns what became of the record.
Action = Callable[[], str]


@dataclass(slots=True)
class Entry:
    """A record going back to the scheduler: its binding, what is known of it, its Item."""

    binding: Binding
    parcel: Parcel
    item: Item


def make_entry(index: int, binding: Binding, parcel: Parcel, source_ref: str,
               extra_headers: Sequence[tuple[str, bytes | None]] = ()) -> Entry:
    """An Entry whose Item carries ``parcel.attempt`` and the record's first-seen time."""
    headers: list[wire.Header] = [{"name": k, "value": v}
                                  for k, v in (*parcel.headers, *extra_headers)]
    item: Item = {
        "id": index,
        "binding": binding.name,
        "payload": parcel.value,
        "key": parcel.key,
        "headers": headers,
        "attempt": parcel.attempt,
        "source_ref": source_ref,
        "record_time_ms": parcel.first_seen_ms,
        "priority": 0,
        "deadline_ms": None,
    }
    return Entry(binding, parcel, item)


def submit(client: SchedulerClient, entries: Sequence[Entry],
           stop: threading.Event | None) -> list[Outcome]:
    """The outcome of every entry, in entry order (one call per :func:`calls` part).

    An answer that does not name every entry of its call once is not taken (the call is
    sent again: :mod:`asynctier.platform.replies`). Raises SchedulerUnavailable when
    ``stop`` is set while no scheduler answers.
    """
    outcomes: list[Outcome] = []
    for start, end, call in calls(entries):
        answer = client.submit_encoded(call.encode(), end - start).result(stop)
        by_id = {o["id"]: o for o in answer}
        outcomes += [{**by_id[i - start], "id": i} for i in range(start, end)]
    return outcomes


def calls(entries: Sequence[Entry],
          cap: int | None = None) -> Iterator[tuple[int, int, CallBuilder]]:
    """``entries[start:end]`` and its call, part after part: each part at most ``cap`` bytes
    of records (:class:`CallBuilder`; default its cap), or a single larger record alone."""
    start = 0
    while start < len(entries):
        call = CallBuilder(cap)
        end = start
        for entry in entries[start:]:
            item = entry.item
            if not call.add(item["binding"], item["payload"], item["key"],
                            [(h["name"], h["value"]) for h in item["headers"]],
                            item["attempt"], item["source_ref"], item["record_time_ms"]):
                break
            end += 1
        yield start, end, call
        start = end


def resolutions(handoff: Handoff, entries: Sequence[Entry],
                outcomes: Sequence[Outcome]) -> tuple[list[str], list[Action]]:
    """Per entry, ``ok`` or an Action that hands its outcome off (index-aligned)."""
    immediate: list[str] = []
    actions: list[Action] = []
    for entry, outcome in zip(entries, outcomes, strict=True):
        if outcome["status"] == "ok":
            immediate.append("ok")
            continue
        immediate.append("")
        actions.append(_resolver(handoff, entry.binding, entry.parcel, outcome))
    return immediate, actions


def _resolver(handoff: Handoff, binding: Binding, parcel: Parcel, outcome: Outcome) -> Action:
    return lambda: handoff.resolve(binding, parcel, outcome)


def hand_off(handoff: Handoff, actions: Sequence[Action], stop: threading.Event | None,
             what: str, retry_s: float = 1.0, max_retry_s: float = 30.0) -> list[str]:
    """Run every action and confirm delivery; on HandoffError write them all again.

    Returns each action's result once the broker confirmed every record. Raises
    HandoffError when ``stop`` is set before that: the caller must not commit.
    """
    wait = retry_s
    while True:
        try:  # produce() itself can refuse a record
            results = [action() for action in actions]
            if not actions:
                return results
            handoff.confirm()
            return results
        except HandoffError as exc:
            log.error("%s: hand-off of %d record(s) to delay/dead-letter topics was not "
                      "confirmed (%s); not committing, writing them again in %gs. Check "
                      "that the broker is up and the delay and dead-letter topics exist.",
                      what, len(actions), exc, wait)
            if stop is not None and stop.wait(wait):
                raise
            if stop is None:
                threading.Event().wait(wait)
            wait = min(wait * 2, max_retry_s)
