"""The SubmitWorkloads call: validate, protect, write durably, answer one result each.

Order of a call: the binding (NOT_FOUND when unknown); room in the process (a bounded
number of workloads under way, else RESOURCE_EXHAUSTED with a retry-after); validation
(invalid ones answered with what to fix; with all-or-nothing the call is refused whole,
INVALID_ARGUMENT); the topic's backlog cap and the tenant's enqueue capacity (over either:
``throttled`` with a retry-after, nothing written); then the write (UNAVAILABLE when the
queue or Kafka does not take it: nothing is answered accepted that was not stored, but
what was refused may have been stored all the same, so a resend carries the same ids).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_source import BindingSource
from asynctier.platform.errors import HandoffError, ParentRefused, QueueUnavailable
from asynctier.platform.framed import RegistryClients
from asynctier.platform.redis_client import REDIS_DOWN
from asynctier.queue.items import NewItem, new_item_id
from asynctier.submitter.backlog import Backlog
from asynctier.submitter.capacity import EnqueueCapacity
from asynctier.submitter.protocol import (
    RETRY_AFTER_KEY,
    Call,
    Result,
    Workload,
    decode_call,
    encode_results,
)
from asynctier.submitter.validation import DEFAULT_MAX_PAYLOAD_BYTES, Validator
from asynctier.submitter.writers import GroupCommit, KafkaWriter, QueueWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitterOptions:
    """The Submitter's limits."""

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: Workloads under way in this process at most; a call past it: RESOURCE_EXHAUSTED.
    max_pending: int = 100_000
    #: Workloads one call may carry.
    max_call: int = 10_000
    #: A topic's backlog (ready + delayed queue items, or a Kafka binding's consumer
    #: lag) past which its new workloads are throttled; None: no cap.
    max_backlog: int | None = 1_000_000
    #: How long a backlog reading is reused.
    backlog_recheck_s: float = 1.0
    #: The retry-after of a call refused for room, and of a workload over the backlog cap.
    busy_retry_ms: int = 200
    backlog_retry_ms: int = 2_000
    #: Queue writes of one namespace under way at once; the calls arriving meanwhile are
    #: written together by the next (group commit), at most ``group_max_rows`` items.
    group_flushes: int = 2
    group_max_rows: int = 5_000


class Refused(Exception):
    """A call refused whole, with its gRPC status and (RESOURCE_EXHAUSTED) retry-after."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None
                 ) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_ms = retry_after_ms


class Submitter:
    """Serves SubmitWorkloads (:meth:`handle` is the gRPC method)."""

    def __init__(self, bindings: BindingSource, queue: QueueWriter | None,
                 kafka: KafkaWriter | None, capacity: EnqueueCapacity | None,
                 backlog: Backlog | None = None,
                 options: SubmitterOptions | None = None,
                 registries: RegistryClients | None = None) -> None:
        self.bindings = bindings
        #: The schema registries' clients (``[schema_registry]``), for registry bindings.
        self.registries = registries or RegistryClients()
        self.queue = queue
        self.options = options or SubmitterOptions()
        self.group = None if queue is None else GroupCommit(
            queue, flushes=self.options.group_flushes, max_rows=self.options.group_max_rows)
        self.kafka = kafka
        self.capacity = capacity
        self.backlog = backlog
        self.pending = 0
        self._validators: dict[str, Validator] = {}
        self._capacity_warned = 0.0

    async def handle(self, request: bytes, context: Any) -> bytes:
        """The gRPC method: bytes in, bytes out; a refusal aborts with its status."""
        started = time.monotonic()
        try:
            call = decode_call(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            results = await self.submit(call)
        except Refused as exc:
            if exc.retry_after_ms is not None:
                context.set_trailing_metadata(((RETRY_AFTER_KEY, str(exc.retry_after_ms)),))
            metrics.count_submitter_refused_call(call.binding, exc.code.name)
            await context.abort(exc.code, str(exc))
        metrics.observe_submitter_call(call.binding, time.monotonic() - started)
        return encode_results(results)

    async def submit(self, call: Call) -> list[Result]:
        """One result per workload of ``call`` (or Refused for the call whole)."""
        binding = await self._binding(call.binding)
        n = len(call.workloads)
        if n > self.options.max_call:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a call carries at most {self.options.max_call:,} workloads, this "
                          f"one {n:,}: split it")
        if self.pending + n > self.options.max_pending:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this Submitter has {self.pending:,} workloads under way (at most "
                          f"{self.options.max_pending:,}): try again shortly or another "
                          "Submitter", self.options.busy_retry_ms)
        self.pending += n
        try:
            return await self._submit(binding, call)
        finally:
            self.pending -= n

    async def _binding(self, name: str) -> Binding:
        binding = self.bindings.get(name)
        if binding is None:
            await self.bindings.refresh()
            binding = self.bindings.get(name)
        if binding is None:
            raise Refused(grpc.StatusCode.NOT_FOUND,
                          f"binding {name!r} does not exist: bind it first (asynctier bind "
                          f"{name} --queue TOPIC or --topic TOPIC ...), or check the name")
        return binding

    def _validator(self, binding: Binding) -> Validator:
        found = self._validators.get(binding.name)
        if found is None or found.binding != binding:
            found = self._validators[binding.name] = Validator(
                binding, self.options.max_payload_bytes, self.registries)
        return found

    async def _submit(self, binding: Binding, call: Call) -> list[Result]:
        results: list[Result | None] = [None] * len(call.workloads)
        check = self._validator(binding)
        valid: list[int] = []
        for i, w in enumerate(call.workloads):
            problem = check.problem(w)
            if problem is None:
                valid.append(i)
            else:
                results[i] = Result("invalid", i, w.id, reason=f"workload {i}: {problem}")
        invalid = len(call.workloads) - len(valid)
        if invalid and call.all_or_nothing:
            first = next(r for r in results if r is not None)
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{invalid} of {len(call.workloads)} workload(s) are invalid and the "
                          f"call asked for all or nothing, so none was written; the first: "
                          f"{first.reason}")
        go = await self._admit(binding, call, valid, results)
        await self._write(binding, call, go, results)
        done = [r for r in results if r is not None]
        metrics.count_submitted(binding.name, binding.tenant, [r.status for r in done])
        return done

    async def _admit(self, binding: Binding, call: Call, valid: list[int],
                     results: list[Result | None]) -> list[int]:
        """The valid positions under the backlog cap and the tenant's capacity; the others
        are answered throttled."""
        if not valid:
            return []
        backlog = None if self.backlog is None else await self.backlog.over_cap(binding)
        if backlog is not None:
            self._throttle(valid, results, call, self.options.backlog_retry_ms,
                           f"the backlog of {binding.source.topic} is {backlog:,}, over the cap of "
                           f"{self.options.max_backlog:,}: the platform is behind")
            return []
        granted, reset_ms = await self._take(binding.tenant, len(valid))
        if call.all_or_nothing and granted < len(valid):
            granted = 0
        self._throttle(valid[granted:], results, call, max(reset_ms, 1),
                       f"tenant {binding.tenant} is over its enqueue capacity for this minute")
        return valid[:granted]

    async def _take(self, tenant: str, n: int) -> tuple[int, int]:
        if self.capacity is None:
            return n, 0
        try:
            return await self.capacity.take(tenant, n)
        except REDIS_DOWN as exc:  # fail open: the write's own limits still hold
            if time.monotonic() - self._capacity_warned > 30:
                self._capacity_warned = time.monotonic()
                log.warning("Redis does not answer (%s): tenants' enqueue capacity is not "
                            "enforced until it does", exc)
            return n, 0

    @staticmethod
    def _throttle(positions: list[int], results: list[Result | None], call: Call,
                  retry_ms: int, why: str) -> None:
        for i in positions:
            results[i] = Result("throttled", i, call.workloads[i].id,
                                reason=f"{why}; retry after {retry_ms} ms",
                                retry_after_ms=retry_ms)

    async def _write(self, binding: Binding, call: Call, go: list[int],
                     results: list[Result | None]) -> None:
        if not go:
            return
        workloads = [call.workloads[i] for i in go]
        if binding.source.kind == "queue":
            await self._enqueue(binding, go, workloads, results)
        else:
            await self._produce(binding, go, workloads, results)

    async def _enqueue(self, binding: Binding, go: list[int], workloads: list[Workload],
                       results: list[Result | None]) -> None:
        if self.group is None:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "this Submitter has no queue store")
        items = [_item(binding.source.topic, w) for w in workloads]
        while True:  # each refused parent takes out its child (and theirs), then again
            if not items:
                return
            try:
                written = await self.group.enqueue(binding.tenant, binding.source.topic, items)
                break
            except ParentRefused as exc:
                go, items = _refuse_children(go, items, exc, results)
            except QueueUnavailable as exc:
                raise Refused(grpc.StatusCode.UNAVAILABLE,
                              f"the queue of binding {binding.name} is unavailable (a commit "
                              "cut off mid-way, as in a failover, may have landed: send again "
                              f"with the same ids, which are not enqueued twice): {exc}"
                              ) from exc
        for i, item, res in zip(go, items, written, strict=True):
            results[i] = Result("accepted" if res.created else "duplicate", i, res.id,
                                topic=item.topic)

    async def _produce(self, binding: Binding, go: list[int], workloads: list[Workload],
                       results: list[Result | None]) -> None:
        if self.kafka is None:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "this Submitter has no Kafka producer")
        try:
            spots = await self.kafka.write(binding.source.topic, workloads)
        except HandoffError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE,
                          f"Kafka did not confirm the records of binding {binding.name} "
                          f"(some may be written: send again): {exc}") from exc
        for i, (partition, offset) in zip(go, spots, strict=True):
            results[i] = Result("accepted", i, topic=binding.source.topic, partition=partition,
                                offset=offset)


def _item(topic: str, w: Workload) -> NewItem:
    """The queue item of a valid workload of a binding of ``topic``."""
    return NewItem(topic, w.payload or b"", id=w.id or new_item_id(),
                   priority=w.priority or 0, headers=w.headers,
                   delay_s=None if w.delay_ms is None else w.delay_ms / 1000,
                   after=tuple((t or topic, i) for t, i in w.after),
                   on_parent_failure=w.on_parent_failure or "fail")


def _refuse_children(go: list[int], items: list[NewItem], exc: ParentRefused,
                     results: list[Result | None]) -> tuple[list[int], list[NewItem]]:
    """Answer the item the store refused for its parent ``invalid``, and the items of the
    call that wait for it (and for them); the rest, to write again."""
    refused = {(items[exc.position].topic, items[exc.position].id)}
    cause = {exc.position: f"its parent {exc.parent[0]}/{exc.parent[1]} {exc.problem}"}
    for n, item in enumerate(items[exc.position + 1:], exc.position + 1):
        parent = next((p for p in item.after if p in refused), None)
        if parent is not None:
            refused.add((item.topic, item.id or ""))  # _item gave every item its id
            cause[n] = f"its parent {parent[0]}/{parent[1]} was refused: see that workload"
    for n, why in cause.items():
        results[go[n]] = Result("invalid", go[n], items[n].id, reason=f"workload {go[n]}: {why}")
    keep = [n for n in range(len(items)) if n not in cause]
    return [go[n] for n in keep], [items[n] for n in keep]
