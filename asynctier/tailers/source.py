"""The source contract: what one kind of source gives the tailer pipeline.

A source reads records, turns them into wire Items, and resolves each outcome its own way;
the pipeline (:mod:`asynctier.tailers.pipeline`) does everything else, once for every
source: batches in flight, outcomes matched by id, hand-off retries, checkpoints in order,
stop and revoke.

===========  =========================  ======================  ========================
source       ok                         retry(after)            failed(reason)
===========  =========================  ======================  ========================
Kafka topic  nothing to write           a delay topic           the dead-letter topic
queue        ack                        nack, deliver later     a dead item
===========  =========================  ======================  ========================

A batch is checkpointed (Kafka: its offsets committed; a queue: its acks and nacks
written) only once every outcome of it is resolved and :meth:`Source.confirm` said the
hand-offs are durable.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from asynctier.platform.rpc import PendingCall
from asynctier.platform.wire import Outcome


@dataclass
class Batch:
    """Records read together and sent as one call; the source's own objects in ``records``
    (the outcome of ``records[i]`` has id ``i``)."""

    records: list[Any]
    call: PendingCall | None  # None: nothing of it goes to a scheduler (all resolved here)
    items: int = 0  # records[:items] were sent (item id = position); the rest resolved here
    mark: Any = None  # what the source needs to checkpoint it (Kafka: offsets)
    extra: Any = None  # anything else the source keeps with the batch
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def handed_off(self) -> bool:
        """True when some of its records were written somewhere (not all ok)."""
        return self.counts["ok"] != len(self.records)


@dataclass
class Prepared:
    """What a source made of the records it was given: the call's request (``None`` when
    nothing is to be sent), the records it covers, and those left for the next batch."""

    records: list[Any]
    request: bytes | None
    mark: Any = None
    extra: Any = None
    rest: list[Any] = field(default_factory=list)
    items: int | None = None  # records[:items] are in the request (None: all of them)


class Source(Protocol):
    """One binding's (or one delay topic's) source of records, as the pipeline sees it."""

    what: str  # for the log: "binding thumbnails", "delay 30s"
    topic: str  # for the metrics: the topic (or queue topic) it reads

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """Up to ``max_records`` records: wait at most ``wait_s`` for the first, then take
        only what is there already. May serve rebalance callbacks (Kafka)."""
        ...

    def prepare(self, records: list[Any]) -> Prepared:
        """The call for ``records``: drop what must not run here (a consume error, a
        revoked partition), build the request (a :class:`~asynctier.platform.calls.CallBuilder`),
        leave the rest."""
        ...

    def wait(self, batch: Batch, superseded: Callable[[], bool]) -> bool:
        """Wait for ``batch``'s answer while keeping the source's session alive (a Kafka
        group membership, a queue lease); False when ``superseded()`` became true meanwhile
        (a revoke resolved the batch)."""
        ...

    def hand_off(self, batch: Batch) -> Counter[str]:
        """Write every outcome of ``batch`` that is not ok its own way (delay topic,
        dead-letter topic, nack...), not waiting for it to be durable; count what became of
        each record. Raises HandoffError when a write is refused."""
        ...

    def confirm(self) -> None:
        """Return once everything handed off so far is durable; HandoffError if not."""
        ...

    def checkpoint(self, batch: Batch, sync: bool) -> None:
        """Record ``batch`` as done (its hand-offs confirmed); ``sync`` when stopping or
        revoking: the checkpoint must have landed on return."""
        ...

    def checkpoint_final(self, scope: Any) -> None:
        """Make sure the checkpoints of ``scope`` (Kafka: partitions; None: all) landed,
        before another reader takes over."""
        ...

    def counted(self, batch: Batch) -> None:
        """``batch`` is checkpointed: count it in the metrics."""
        ...
