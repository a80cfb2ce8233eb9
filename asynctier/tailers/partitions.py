"""A Kafka tailer's partitions: which it owns, and the rebalance callbacks, once for all.

Every Kafka tailer (a binding's, a delay topic's, a moved binding's) owns the partitions
assigned to it and neither revoked nor lost since: only their records run and only their
offsets are committed. A revoked partition's batches are finished, confirmed and committed
inside the revoke (the pipeline drains them); a lost one is never committed, and what was
read of it and not sent is dropped (its new owner runs it). Each callback ends with its own
incremental (un)assign (:func:`~asynctier.platform.kafka.take_over`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asynctier.platform.kafka import consume_error, take_over
from asynctier.tailers.source import TP

if TYPE_CHECKING:
    from asynctier.tailers.pipeline import Pipeline

log = logging.getLogger(__name__)

#: Told of partitions assigned (the consumer, its TopicPartitions).
Assigned = Callable[[Any, list[Any]], None]
#: Told of partitions revoked or lost, before they are given back.
Gone = Callable[[set[TP]], None]


def _names(partitions: list[Any]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}" for tp in partitions) or "nothing"


class Partitions:
    """One consumer's partitions and its rebalance callbacks (``on_assign``, ``on_revoke``,
    ``on_lost``: pass them to ``subscribe``). ``what`` names the tailer in the log."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.owned: set[TP] = set()
        self.consumer: Any = None  # the session's: a callback of another one is stale
        self.pipeline: Pipeline[Any] | None = None  # drains a revoke, forgets a loss
        self.in_revoke = False  # inside a revoke callback: no polling the consumer
        self._assigned: list[Assigned] = []
        self._gone: list[Gone] = []

    def listen(self, *, assigned: Assigned | None = None, gone: Gone | None = None) -> None:
        """Tell ``assigned`` of partitions assigned, ``gone`` of partitions revoked or lost."""
        if assigned is not None:
            self._assigned.append(assigned)
        if gone is not None:
            self._gone.append(gone)

    def start(self, consumer: Any) -> None:
        """A new session on ``consumer``: it owns nothing yet."""
        self.consumer = consumer
        self.owned.clear()

    def _stale(self, consumer: Any) -> bool:
        """A callback of an earlier session's consumer (one whose ``close()`` was given up
        and returned late): it must not touch this session's partitions."""
        return self.consumer is not None and consumer is not self.consumer

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions assigned: they are run and committed from now on."""
        take_over(consumer, partitions, assign=True)  # whatever the session (see take_over)
        if self._stale(consumer):
            return
        self.owned.update((tp.topic, tp.partition) for tp in partitions)
        log.info("%s: assigned %s", self.what, _names(partitions))
        for assigned in self._assigned:
            assigned(consumer, partitions)

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions revoked: finish, confirm and commit their batches first."""
        if not self._stale(consumer):
            pipeline = self.pipeline
            if partitions:
                log.info("%s: revoking %s; finishing %d batch(es) under way", self.what,
                         _names(partitions), len(pipeline.in_flight) if pipeline else 0)
            gone = {(tp.topic, tp.partition) for tp in partitions}
            self.in_revoke = True
            try:
                if pipeline is not None:
                    pipeline.revoke(gone, lambda m: (m.topic(), m.partition()) in gone)
            finally:
                self.in_revoke = False
                self._forget(gone)
        take_over(consumer, partitions, assign=False)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions lost: never run nor committed here again, unless assigned again."""
        if not self._stale(consumer):
            log.warning("%s: lost %s; their batches under way will not be committed",
                        self.what, _names(partitions))
            gone = {(tp.topic, tp.partition) for tp in partitions}
            self._forget(gone)
            if self.pipeline is not None:
                self.pipeline.forget(lambda m: (m.topic(), m.partition()) in gone)
        take_over(consumer, partitions, assign=False)

    def _forget(self, gone: set[TP]) -> None:
        self.owned.difference_update(gone)
        for forget in self._gone:
            forget(gone)


def sort_out(records: list[Any], owned: set[TP], what: str,
             topic: str) -> tuple[list[Any], list[Any]]:
    """(records of owned partitions, records of partitions gone since they were read);
    consume errors are logged (a fatal one raises) and left out."""
    good: list[Any] = []
    gone: list[Any] = []
    for msg in records:
        if msg.error() is not None:
            consume_error(msg.error(), what, topic)
        elif (msg.topic(), msg.partition()) in owned:
            good.append(msg)
        else:
            gone.append(msg)  # revoked or lost since it was read: its new owner runs it
    return good, gone
