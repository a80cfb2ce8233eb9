"""The scheduler's one call: ``submit(items) -> outcomes`` (docs/design.md, Tailer -> scheduler).

:class:`Scheduler` groups a batch by binding, hands each group to the
:class:`~asynctier.scheduler.dispatch.Dispatcher` and returns one outcome per
item. An item of a binding the scheduler does not know makes it read the registry again
once; still unknown, the item comes back later (a retry that spends no attempt).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc

from asynctier.platform.binding_source import BindingSource
from asynctier.platform.rpc import RESENT_KEY
from asynctier.platform.wire import Item, Outcome, decode_items, encode_outcomes, retry
from asynctier.scheduler.admission import Admission
from asynctier.scheduler.bounded import BoundedQueue
from asynctier.scheduler.dispatch import Dispatcher, Report
from asynctier.scheduler.gates import GATES, GateFactory
from asynctier.scheduler.guard import Guard
from asynctier.scheduler.limits.breaker import Breakers
from asynctier.scheduler.limits.tenants import TenantStore
from asynctier.scheduler.options import SchedulerOptions
from asynctier.scheduler.queues import FairQueue
from asynctier.scheduler.runtime import Runtime
from asynctier.scheduler.sizing import ChunkSizer
from asynctier.scheduler.tenants import TenantFollower

log = logging.getLogger(__name__)


class Scheduler:
    """Runs submitted batches: admission, fair bounded queue, workers, outcomes.

    ``guard`` runs each record once (none: :class:`~.guard.OpenGuard`, every record runs);
    ``gates`` is the order admission asks its gates in (:data:`~.gates.GATES`).
    """

    def __init__(self, bindings: BindingSource, runtime: Runtime, admission: Admission,
                 options: SchedulerOptions | None = None,
                 breakers: Breakers | None = None,
                 tenants: TenantStore | None = None, guard: Guard | None = None,
                 gates: Sequence[GateFactory] = GATES) -> None:
        self.options = options = options or SchedulerOptions()
        self.bindings = bindings
        self.runtime = runtime
        self.admission = admission
        # A tenant's turn is the smallest chunk's worth of items: a trickling tenant then
        # waits behind a few chunks of a flooding one, not behind a largest chunk's worth
        # of its small chunks of slow items (the shares by weight are the same).
        fair: FairQueue[Any] = FairQueue(options.min_chunk_items, options.tier_weights,
                                         options.tenant_weights)
        self.queue = BoundedQueue(fair, options.max_queued_items)
        sizer = ChunkSizer(options.chunk_target_s, options.min_chunk_items,
                           options.max_chunk_items)
        self.dispatcher = Dispatcher(runtime, admission, self.queue, sizer, options,
                                     guard=guard, breakers=breakers, gates=gates)
        self.breakers = breakers
        self.tenants = (None if tenants is None else
                        TenantFollower(tenants, fair, base=dict(options.tenant_weights)))

    def start(self) -> None:
        """Start the workers (on the running loop), and the tenant follower."""
        self.dispatcher.start()
        if self.tenants is not None:
            self.tenants.start()

    async def stop(self) -> None:
        """Stop the workers and the thread pool."""
        await self.dispatcher.stop()
        self.runtime.close()
        await self.runtime.processes.wait_closed()
        if self.tenants is not None:
            await self.tenants.stop()

    @property
    def load(self) -> int:
        """Items queued or running here."""
        # a call past its timeout that still runs in its thread is load too
        return self.queue.items + self.dispatcher.running_items + self.runtime.hung_threads

    async def submit(self, request: bytes, context: Any = None) -> bytes:
        """The gRPC method: Avro items in, Avro outcomes out."""
        try:
            items = decode_items(request)
        except Exception as exc:
            log.error("a submit request does not decode: %s", exc)
            if context is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"the request does not decode: {exc}")
            raise
        if context is not None and _resent(context):
            for item in items:  # a copy may be running: every item is claimed first
                item.pop("fresh", None)
        return encode_outcomes(await self.process(items))

    async def process(self, items: list[Item],
                      report: Report | None = None) -> list[Outcome]:
        """One outcome per item (any order, matched by id); with ``report``, outcomes are
        also reported as they end (see :meth:`Dispatcher.submit`)."""
        groups = _by_binding(items)
        if any(self.bindings.get(name) is None for name in groups):
            await self.bindings.refresh()
        calls = []
        outcomes: list[Outcome] = []
        for name, group in groups.items():
            binding = self.bindings.get(name)
            if binding is None:
                outcomes.extend(self._unknown(name, group))
            else:
                calls.append(self.dispatcher.submit(binding, group, report))
        for done in await asyncio.gather(*calls):
            outcomes.extend(done)
        return outcomes

    def _unknown(self, name: str, items: list[Item]) -> list[Outcome]:
        after = self.options.unknown_binding_retry_s
        log.warning("%d item(s) name the unknown binding %r; they come back in %gs",
                    len(items), name, after)
        return [retry(i["id"], f"unknown binding {name!r}: the scheduler does not know it "
                      "(yet)", after_s=after, spends_attempt=False) for i in items]


def _by_binding(items: list[Item]) -> dict[str, list[Item]]:
    if not items:
        return {}
    first = items[0]["binding"]
    if all(item["binding"] == first for item in items):  # the usual batch: one binding
        return {first: items}
    groups: dict[str, list[Item]] = {}
    for item in items:
        group = groups.get(item["binding"])
        if group is None:
            groups[item["binding"]] = [item]
        else:
            group.append(item)
    return groups


def _resent(context: Any) -> bool:
    """Whether the call is a copy sent again (:data:`~asynctier.platform.rpc.RESENT`)."""
    return any(key == RESENT_KEY for key, _ in context.invocation_metadata() or ())
