"""A test-only source: items from a list, acks, nacks and dead items recorded in memory.

It implements :class:`asynctier.tailers.source.Source` the way a queue would: ok -> ack,
``retry(after)`` -> a nack (deliver again after ``after_s``, or the binding's ladder step),
``failed(reason)`` -> a dead item. Hand-offs are written by :meth:`ListSource.hand_off` and
become durable only at a :meth:`ListSource.confirm` that succeeds (the first
``refuse_confirms`` raise HandoffError, and what they would have confirmed is lost, as with
a refused write); :meth:`ListSource.checkpoint` records the batch's acks, in read order.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asynctier.delay_streams.ladder import ladder_delay
from asynctier.platform.binding import Binding
from asynctier.platform.calls import CallBuilder
from asynctier.platform.errors import HandoffError
from asynctier.tailers.source import Batch, Prepared


@dataclass(frozen=True)
class Entry:
    """One item of the list: its position, binding and payload."""

    n: int
    binding: str
    payload: bytes | None


@dataclass(frozen=True)
class Nack:
    """An item to deliver again after ``after_s``, and why."""

    n: int
    after_s: float
    reason: str | None


class ListSource:
    """The items of ``entries`` (``(binding name, payload)``) as a Source."""

    what = "list source (test)"
    topic = "list"

    def __init__(self, bindings: list[Binding], entries: list[tuple[str, bytes | None]],
                 refuse_confirms: int = 0) -> None:
        self.bindings = {b.name: b for b in bindings}
        self.unread = [Entry(n, name, payload) for n, (name, payload) in enumerate(entries)]
        self.refuse_confirms = refuse_confirms
        self.lock = threading.Lock()
        self.idle = threading.Event()  # never set: read()'s wait when the list is empty
        self.events: list[tuple[Any, ...]] = []  # hand_off, confirm, checkpoint, in order
        self.written: list[Nack | tuple[int, str]] = []  # handed off, not confirmed yet
        self.nacks: list[Nack] = []  # durable
        self.dead: list[tuple[int, str]] = []  # durable: (item, reason)
        self.acks: list[int] = []  # checkpointed ok items, in the order checkpointed
        self.checkpointed: list[int] = []  # every item checkpointed, in that order
        self.confirmed = 0  # confirms that succeeded

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """The next items of the list; waits ``wait_s`` when there are none left."""
        with self.lock:
            got, self.unread[:max_records] = self.unread[:max_records], []
        if not got and wait_s > 0:
            self.idle.wait(wait_s)
        return got

    def prepare(self, records: list[Any]) -> Prepared[None]:
        """One call of the records that fit; the rest for the next batch."""
        call = CallBuilder()
        for at, entry in enumerate(records):
            if not call.add(entry.binding, entry.payload, None, None, 1,
                            f"list/0/{entry.n}", int(time.time() * 1000)):
                return Prepared(records[:at], call.encode(), None, rest=records[at:])
        return Prepared(records, call.encode(), None)

    def wait(self, batch: Batch[None], superseded: Callable[[], bool]) -> bool:
        """Nothing to keep alive while the call runs."""
        return True

    def hand_off(self, batch: Batch[None]) -> Counter[str]:
        """Nack the retries and kill the failures (written, durable once confirmed)."""
        counts: Counter[str] = Counter()
        for outcome in batch.outcomes:
            entry: Entry = batch.records[outcome["id"]]
            status = outcome["status"]
            if status == "ok":
                counts["ok"] += 1
            elif status == "retry":
                after = outcome["after_s"]
                if after is None:
                    after = ladder_delay(1, self.bindings[entry.binding].retries.ladder_s)
                self.written.append(Nack(entry.n, after, outcome["reason"]))
                counts["retry"] += 1
            else:
                self.written.append((entry.n, outcome["reason"] or "?"))
                counts["dead_letter"] += 1
        self.events.append(("hand_off", [e.n for e in batch.records]))
        return counts

    def confirm(self) -> None:
        """What was written is durable; the first ``refuse_confirms`` times it is lost."""
        written, self.written = self.written, []
        if self.refuse_confirms > 0:
            self.refuse_confirms -= 1
            self.events.append(("confirm", "refused"))
            raise HandoffError(f"{len(written)} hand-off(s) refused (test)")
        for done in written:
            if isinstance(done, Nack):
                self.nacks.append(done)
            else:
                self.dead.append(done)
        self.confirmed += 1
        self.events.append(("confirm", "ok"))

    def checkpoint(self, batch: Batch[None], sync: bool) -> None:
        """Ack the batch's ok items and record it as done."""
        ok = {o["id"] for o in batch.outcomes if o["status"] == "ok"}
        with self.lock:
            self.acks += [e.n for i, e in enumerate(batch.records) if i in ok]
            self.checkpointed += [e.n for e in batch.records]
        self.events.append(("checkpoint", [e.n for e in batch.records]))

    def checkpoint_final(self, scope: Any) -> None:
        """Every checkpoint landed at once."""

    def counted(self, batch: Batch[None]) -> None:
        """No metrics of its own."""
