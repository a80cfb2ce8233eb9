"""The sources' contracts: what a tailer loop asks of the records it reads.

Two contracts, one per way a source makes its work durable (docs/design.md, The source
contracts and their two loops):

* :class:`Source`, **checkpointed in order**: batches are read in order and a batch is
  checkpointed (Kafka: its offsets committed) only once it and every batch before it are
  resolved and :meth:`Source.confirm` said the hand-offs are durable. The pipeline
  (:mod:`asynctier.tailers.pipeline`) runs it: the Kafka, delay and moved tailers and the
  parked-key runner. :class:`OffsetSource` is a Kafka topic's: what the strategies around
  one (per-key order, moved records) ask of it.
* :class:`LeaseSource`, **leased and resolved one by one**: every item is leased on its
  own, so it is resolved (ack, nack, dead item) the moment it ends, whatever the others
  do. Long work (:mod:`asynctier.tailers.long_work`) runs it: the queue tailers.

===========  =========================  ======================  ========================
source       ok                         retry(after)            failed(reason)
===========  =========================  ======================  ========================
Kafka topic  nothing to write           a delay topic           the dead-letter topic
queue        ack                        nack, deliver later     a dead item
===========  =========================  ======================  ========================
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from asynctier.platform.rpc import PendingCall
from asynctier.platform.wire import Outcome

if TYPE_CHECKING:  # the contracts name them; importing them would load the Kafka client
    from asynctier.delay_streams.handoff import Handoff
    from asynctier.platform.supervise import Supervisor
    from asynctier.queue.items import Leased

#: A topic partition: (topic, partition).
TP = tuple[str, int]
#: Per partition, the highest offset a batch holds (its checkpoint commits past it).
Offsets = dict[TP, int]

#: What a source keeps with each of its batches (its own type per source).
E = TypeVar("E")


@dataclass
class Batch(Generic[E]):
    """Records read together and sent as one call; the source's own objects in ``records``
    (the outcome of ``records[i]`` has id ``i``)."""

    records: list[Any]
    call: PendingCall | None  # None: nothing of it goes to a scheduler (all resolved here)
    items: int  # records[:items] were sent (item id = position); the rest resolved here
    mark: Offsets  # what the source checkpoints it by (Kafka: offsets; others: empty)
    extra: E  # what else the source keeps with the batch
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def handed_off(self) -> bool:
        """True when some of its records were written somewhere (not all ok)."""
        return self.counts["ok"] != len(self.records)


@dataclass
class Prepared(Generic[E]):
    """What a source made of the records it was given: the call's request (``None`` when
    nothing is to be sent), the records it covers, and those left for the next batch."""

    records: list[Any]
    request: bytes | None
    extra: E
    mark: Offsets = field(default_factory=dict)
    rest: list[Any] = field(default_factory=list)
    items: int | None = None  # records[:items] are in the request (None: all of them)


def high_marks(records: Sequence[Any]) -> Offsets:
    """Per partition, the highest offset of these Kafka records."""
    high: Offsets = {}
    for msg in records:
        tp = (msg.topic(), msg.partition())
        offset = msg.offset()
        if offset > high.get(tp, -1):
            high[tp] = offset
    return high


class Source(Protocol[E]):
    """A source checkpointed in order, as the pipeline sees it: one binding's topic, one
    delay topic, one binding's parked keys."""

    what: str  # for the log: "binding thumbnails", "delay 30s"
    topic: str  # for the metrics: the topic (or queue topic) it reads

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """Up to ``max_records`` records: wait at most ``wait_s`` for the first, then take
        only what is there already. May serve rebalance callbacks (Kafka)."""
        ...

    def prepare(self, records: list[Any]) -> Prepared[E]:
        """The call for ``records``: drop what must not run here (a consume error, a
        revoked partition), build the request (a :class:`~asynctier.platform.calls.CallBuilder`),
        leave the rest."""
        ...

    def wait(self, batch: Batch[E], superseded: Callable[[], bool]) -> bool:
        """Wait for ``batch``'s answer while keeping the source's session alive (a Kafka
        group membership); False when ``superseded()`` became true meanwhile (a revoke
        resolved the batch)."""
        ...

    def hand_off(self, batch: Batch[E]) -> Counter[str]:
        """Write every outcome of ``batch`` that is not ok its own way (delay topic,
        dead-letter topic, an enqueue...), not waiting for it to be durable; count what
        became of each record. Raises HandoffError when a write is refused."""
        ...

    def confirm(self) -> None:
        """Return once everything handed off so far is durable; HandoffError if not."""
        ...

    def checkpoint(self, batch: Batch[E], sync: bool) -> None:
        """Record ``batch`` as done (its hand-offs confirmed); ``sync`` when stopping or
        revoking: the checkpoint must have landed on return."""
        ...

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """Make sure the checkpoints of ``scope`` (Kafka: partitions; None: all) landed,
        before another reader takes over."""
        ...

    def counted(self, batch: Batch[E]) -> None:
        """``batch`` is checkpointed: count it in the metrics."""
        ...


class OffsetSource(Source[E], Protocol[E]):
    """A Kafka topic read by one consumer: what a strategy wrapped around it (per-key
    order, moved records) uses besides the :class:`Source` calls it passes on."""

    binding: Any  # the Binding it reads for
    handoff: Handoff  # where its retries and dead letters go
    owned: set[TP]  # assigned, neither revoked nor lost: only these run and commit
    stats: Counter[str]  # what became of its records so far

    def wait(self, batch: Batch[Any], superseded: Callable[[], bool]) -> bool:
        """As :meth:`Source.wait`, for any batch of its records (a strategy's too)."""
        ...

    def counted(self, batch: Batch[Any]) -> None:
        """As :meth:`Source.counted`, for any batch of its records."""
        ...

    def commit(self, mark: Offsets, sync: bool) -> None:
        """Commit past ``mark`` (per partition the highest offset done) where still owned."""
        ...

    def hold(self, pause: Sequence[TP], resume: Sequence[TP]) -> None:
        """Stop reading ``pause`` and read ``resume`` again (from where it stood); a
        partition held stays held while a call is waited for."""
        ...

    def on_gone(self, forget: Callable[[set[TP]], None]) -> None:
        """Call ``forget`` with the partitions revoked or lost, before they are given
        back."""
        ...

    def beside(self, stop: threading.Event) -> list[Supervisor]:
        """Start the loops that run beside this source's pipeline until ``stop``."""
        ...


class LeaseSource(Protocol):
    """A source whose items are leased, and resolved, one by one: what long work
    (:mod:`asynctier.tailers.long_work`) asks of a queue topic."""

    binding: Any  # the Binding it reads for
    what: str
    topic: str
    stop: threading.Event  # the tailer's: set when it stops

    def read(self, max_records: int, wait_s: float) -> list[Leased]:
        """Lease up to ``max_records`` ready items, waiting at most ``wait_s``."""
        ...

    def on_ready(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` too whenever items may have become ready (it must not block)."""
        ...

    def prepare(self, records: list[Leased]) -> Prepared[None]:
        """The call for what fits of ``records``; the rest left for the next."""
        ...

    def resolve_items(self, pairs: Sequence[tuple[Leased, Outcome]]) -> Counter[str]:
        """Ack, nack or kill these items in one write (durable on return); HandoffError
        when it was refused."""
        ...

    def extend(self, ids: list[str]) -> set[str]:
        """Extend the leases of ``ids``; those still held. AsynctierError when the store
        cannot be reached."""
        ...

    def save_checkpoint(self, item_id: str, state: bytes, kind: str) -> bool:
        """Store a checkpoint on the item's row, extending its lease; False when the lease
        is not held. AsynctierError when the store cannot be reached."""
        ...

    def unavailable(self, exc: Exception) -> None:
        """Say (now and then) that the store cannot be reached."""
        ...


class Around(Generic[E]):
    """A strategy wrapped around an :class:`OffsetSource` (per-key order, moved records):
    it passes every call on to the source but those it changes (``prepare`` and
    ``hand_off`` at least); its batches' extra is its own (``E``)."""

    def __init__(self, source: OffsetSource[Any]) -> None:
        self.source = source
        self.what, self.topic = source.what, source.topic
        self.binding, self.handoff = source.binding, source.handoff
        self.owned, self.stats = source.owned, source.stats

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        """The source's records."""
        return self.source.read(max_records, wait_s)

    def wait(self, batch: Batch[Any], superseded: Callable[[], bool]) -> bool:
        """The source's wait (its session kept alive)."""
        return self.source.wait(batch, superseded)

    def confirm(self) -> None:
        """The source's hand-offs confirmed."""
        self.source.confirm()

    def checkpoint(self, batch: Batch[Any], sync: bool) -> None:
        """Commit past the batch's offsets."""
        self.source.commit(batch.mark, sync)

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """The source's final checkpoint."""
        self.source.checkpoint_final(scope)

    def counted(self, batch: Batch[Any]) -> None:
        """The source's metrics."""
        self.source.counted(batch)

    def commit(self, mark: Offsets, sync: bool) -> None:
        """Commit past ``mark``."""
        self.source.commit(mark, sync)

    def hold(self, pause: Sequence[TP], resume: Sequence[TP]) -> None:
        """Pause and resume partitions of the source."""
        self.source.hold(pause, resume)

    def on_gone(self, forget: Callable[[set[TP]], None]) -> None:
        """Told of the source's partitions gone."""
        self.source.on_gone(forget)

    def beside(self, stop: threading.Event) -> list[Supervisor]:
        """The source's loops beside the pipeline."""
        return self.source.beside(stop)
