"""The gate: one admission check with one job, and the hooks the dispatcher calls on it.

Every hook has a no-op default (as dramatiq's ``Middleware``), so a gate writes only the
ones its job needs:

- :meth:`Gate.admit` at intake: (refused outcomes, admitted items). A gate with
  ``per_chunk`` False is asked once per batch, before the run-once claim; one with
  ``per_chunk`` True per chunk, after it (what it refuses is freed for the copy that comes
  back, and its error refuses the chunk for a while instead of failing the call);
- :meth:`Gate.enqueue` when a chunk it admitted is about to be queued (it may wait);
- :meth:`Gate.dequeue` when a chunk leaves the queue for a worker: what it refuses then
  does not run;
- :meth:`Gate.lanes` and :meth:`Gate.slot`: a gate that caps concurrency runs a chunk one
  item at a time, in at most that many lanes, each item inside its slot;
- :meth:`Gate.after_run` with a chunk's outcomes (it may change them);
- :meth:`Gate.start` and :meth:`Gate.close` with the dispatcher's workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from asynctier.platform.binding import Binding
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.bounded import BoundedQueue, Chunk
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.options import SchedulerOptions

#: A gate's answer: (outcomes of the items it refuses, the items it lets through).
Admitted = tuple[list[Outcome], list[Item]]


class Gate:
    """An admission check; the defaults let everything through and watch nothing."""

    #: False: asked once per batch before the run-once claim; True: per chunk after it.
    per_chunk: ClassVar[bool] = False

    async def admit(self, binding: Binding, items: list[Item]) -> Admitted:
        """(refused outcomes, admitted items) at intake."""
        return [], items

    async def enqueue(self, chunk: Chunk) -> None:
        """``chunk`` (admitted) is about to be queued."""

    def dequeue(self, binding: Binding, items: list[Item]) -> Admitted:
        """(refused outcomes, items to run) of a chunk leaving the queue."""
        return [], items

    def lanes(self, binding: Binding) -> int | None:
        """The concurrency this gate allows ``binding`` now (None: it does not cap it)."""
        return None

    def slot(self, binding: Binding) -> contextlib.AbstractAsyncContextManager[None]:
        """Held around each item of a binding this gate caps."""
        return contextlib.nullcontext()

    async def after_run(self, binding: Binding, items: Sequence[Item],
                        outcomes: list[Outcome]) -> list[Outcome]:
        """A chunk's outcomes once it ran; returns them (possibly changed)."""
        return outcomes

    def start(self) -> None:
        """The dispatcher's workers start (on the running loop)."""

    async def close(self) -> None:
        """The dispatcher's workers stopped."""


@dataclass
class GateContext:
    """What gates are built from: the scheduler's controls, its queue and options, and
    ``answer``, which answers a chunk taken out of the queue (its claims freed first)."""

    admission: Admission
    breakers: Breakers | None
    queue: BoundedQueue
    options: SchedulerOptions
    answer: Callable[[Chunk, list[Outcome]], None]


#: Builds one gate from the context, or None when the scheduler has no use for it.
GateFactory = Callable[[GateContext], Gate | None]
