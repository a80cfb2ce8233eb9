"""The dispatcher's side of the run-once guard (:mod:`.guard`).

Records are claimed per batch before they queue: one that already succeeded is answered
``ok`` without running, one still running elsewhere (a copy read again after a crash)
waits for that run to end, then is answered ``ok`` or runs here. A fresh record (its
tailer knows no copy of it was sent before: docs/design.md, Run once off the path) queues
at once, its running range written beside it; the write-downs of the binding wait for
such writes to land, so a range never lands after the write-down that removes it. After
a chunk ran, how it ended is written down beside the workers (they take the next chunk):
a chunk that all succeeded is answered at once (its claims hold until the marks land, so
a copy read meanwhile waits), any other too while the guard surely holds its records
(:meth:`Guard.holds`), else once the write landed (a failure here may have succeeded in
another copy). A guard that fails is logged and its records run unguarded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.supervise import watch
from asynctier.platform.wire import Item, Outcome, ok, retry
from asynctier.scheduler.bounded import Chunk
from asynctier.scheduler.guard import BUSY, DONE, RUN, TAKEN_OVER, Guard

log = logging.getLogger(__name__)

#: A record running elsewhere is asked about again after this, doubling up to the max.
BUSY_POLL_FIRST_S = 0.05
BUSY_POLL_MAX_S = 1.0
#: ... and is waited for the binding's timeout plus this, then comes back later.
BUSY_GRACE_S = 10.0
#: How long stopping waits for the write-downs of the chunks that ran.
WRITE_DOWN_WAIT_S = 5.0

#: (``ok`` outcomes of the records already done, records to run, records busy elsewhere).
Claimed = tuple[list[Outcome], list[Item], list[Item]]
#: Queues claimed items and returns their outcomes (the dispatcher's).
RunClaimed = Callable[[Binding, list[Item]], Awaitable[list[Outcome]]]


class Claims:
    """Claims, waits for busy records, writes down how chunks ended."""

    def __init__(self, guard: Guard, retry_s: float, busy_grace_s: float = BUSY_GRACE_S) -> None:
        self.guard = guard
        self.retry_s = retry_s
        self.busy_grace_s = busy_grace_s
        self._background: set[asyncio.Future[None]] = set()
        # the writes of fresh records' running ranges under way, by binding name
        self._beside: dict[str, set[asyncio.Future[None]]] = {}
        self._writes: set[asyncio.Future[None]] = set()  # chunks being written down
        # successes of chunks that still run, to write down together (binding name ->
        # the binding, its items, their outcomes)
        self._early: dict[str, tuple[Binding, list[Item], list[Outcome]]] = {}

    async def stop(self) -> None:
        """Wait (at most ``WRITE_DOWN_WAIT_S``) for the write-downs of the chunks that ran."""
        if not self._writes:
            return
        _, late = await asyncio.wait(set(self._writes), timeout=WRITE_DOWN_WAIT_S)
        if late:
            log.warning("%d chunk(s) that ran were not written down within %gs of "
                        "stopping; their records may run again if read again",
                        len(late), WRITE_DOWN_WAIT_S)

    async def claim_batch(self, binding: Binding, items: list[Item]) -> Claimed:
        """Claim a batch's records (those busy elsewhere are counted as waited for); the
        fresh ones run at once, the guard told beside their run."""
        fresh = [i for i in items if i.get("fresh")]
        if not fresh:
            return await self._claim_counted(binding, items)
        claim, write = self.guard.run_fresh(binding, fresh)
        if write is not None:
            self._beside_run(binding, write)
        metrics.count_run_once(binding.name, "fresh", len(fresh) - len(claim))
        if not claim and len(fresh) == len(items):  # the common case: all run at once
            return [], items, []
        kept = {id(i) for i in claim}
        done, run, busy = await self._claim_counted(
            binding, [i for i in items if not i.get("fresh") or id(i) in kept])
        runs = {id(i) for i in run}
        return done, [i for i in items if id(i) in runs or (
            i.get("fresh") and id(i) not in kept)], busy  # in the batch's order

    async def _claim_counted(self, binding: Binding, items: list[Item]) -> Claimed:
        done, run, busy = await self.claim(binding, items)
        if busy:
            metrics.count_run_once(binding.name, "waited", len(busy))
        return done, run, busy

    def _beside_run(self, binding: Binding, write: Coroutine[Any, Any, None]) -> None:
        """Make a fresh batch's write (its running ranges) beside its run; the binding's
        write-downs wait for it (:meth:`finish`), so none overtakes it."""
        beside = self._beside.setdefault(binding.name, set())
        task = watch(asyncio.ensure_future(self._write_beside(binding, write)),
                     "a run-once write of fresh records")
        beside.add(task)
        task.add_done_callback(beside.discard)

    @staticmethod
    async def _write_beside(binding: Binding, write: Coroutine[Any, Any, None]) -> None:
        try:
            await write
        except Exception:
            log.exception("binding %s: could not say in Redis that fresh records run here; "
                          "a copy read again meanwhile may run beside them",
                          binding.name, extra={"binding": binding.name})

    async def claim(self, binding: Binding, items: list[Item]) -> Claimed:
        """(``ok`` outcomes of the records already done, records to run, records busy)."""
        if not items:
            return [], items, []
        try:
            codes = await self.guard.claim(binding, items)
            if len(codes) != len(items):
                raise ValueError(f"{len(codes)} claim codes for {len(items)} items")
        except asyncio.CancelledError:
            # The caller went away while the claim was on its way: it may have landed in
            # Redis all the same, and a claim nobody runs would hold back the copy sent
            # again (a claim held by another scheduler, or none, is left as it is).
            self.free_later(binding, items)
            raise
        except Exception:
            log.exception("binding %s: could not claim %d record(s); running them without "
                          "the run-once guard", binding.name, len(items))
            return [], items, []
        if codes.count(RUN) == len(codes):
            return [], items, []
        return self._sorted(binding, items, codes)

    @staticmethod
    def _sorted(binding: Binding, items: list[Item], codes: str) -> Claimed:
        done = [ok(i["id"]) for i, c in zip(items, codes, strict=True) if c == DONE]
        run = [i for i, c in zip(items, codes, strict=True) if c in (RUN, TAKEN_OVER)]
        busy = [i for i, c in zip(items, codes, strict=True) if c == BUSY]
        if done:
            metrics.count_run_once(binding.name, "skipped", len(done))
        taken = codes.count(TAKEN_OVER)
        if taken:
            metrics.count_run_once(binding.name, "taken_over", taken)
            log.warning("binding %s: %d record(s) were claimed by a scheduler that died before "
                        "they ended; they run again here", binding.name, taken,
                        extra={"binding": binding.name})
        return done, run, busy

    async def when_free(self, binding: Binding, busy: list[Item],
                        run: RunClaimed) -> list[Outcome]:
        """Outcomes of records running elsewhere: ``ok`` once that run succeeded, or run
        here once it failed or its scheduler died; a held retry (no attempt spent) when
        the other run is still going after the binding's timeout and a grace."""
        results: list[Outcome] = []
        deadline = time.monotonic() + binding.execution.timeout_s + self.busy_grace_s
        pause = BUSY_POLL_FIRST_S
        while busy:
            await asyncio.sleep(pause)
            pause = min(pause * 2, BUSY_POLL_MAX_S)
            done, claimed, busy = await self.claim(binding, busy)
            results += done
            if claimed:
                results += await run(binding, claimed)
            if busy and time.monotonic() >= deadline:
                results += self._still_busy(binding, busy)
                break
        return results

    def _still_busy(self, binding: Binding, busy: list[Item]) -> list[Outcome]:
        log.warning("binding %s: %d record(s) are still running in another scheduler "
                    "after %gs; they come back in %gs without spending an attempt",
                    binding.name, len(busy), binding.execution.timeout_s + self.busy_grace_s,
                    self.retry_s, extra={"binding": binding.name})
        return [retry(i["id"], "a copy of this record is still running elsewhere",
                      after_s=self.retry_s, spends_attempt=False) for i in busy]

    async def finish(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """Tell the guard how claimed ``items`` ended (successes are remembered); the ids
        of those that failed here but were done meanwhile by another copy."""
        if not items:
            return set()
        beside = self._beside.get(binding.name)
        if beside:  # a fresh record's range lands before its write-down
            await asyncio.wait(set(beside))
        try:
            return await self.guard.finish(binding, items, outcomes)
        except Exception:
            log.exception("binding %s: could not record how %d claimed record(s) ended; a "
                          "copy read again may run again", binding.name, len(items))
            return set()

    def free_later(self, binding: Binding, items: Sequence[Item]) -> None:
        """Free claimed ``items`` that will not run here, even though the caller is being
        cancelled."""
        self._later(self.finish(binding, items, []))

    def answer(self, chunk: Chunk, outcomes: list[Outcome]) -> None:
        """Answer a chunk that did not run (its claims freed first, as after a run)."""
        self._later(self._answer(chunk, outcomes))

    async def _answer(self, chunk: Chunk, outcomes: list[Outcome]) -> None:
        await self.finish(chunk.binding, chunk.items, outcomes)
        if not chunk.future.done():
            chunk.future.set_result(outcomes)

    def _later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` to its end even though the caller is being cancelled."""
        task = watch(asyncio.ensure_future(coro), "a scheduler background task")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def write_down(self, chunk: Chunk, outcomes: list[Outcome] | None) -> None:
        """Write down how ``chunk`` ended (successes done, the rest freed) without holding
        the worker for the round trip, and answer it: at once when every item succeeded or
        no other scheduler can have taken its records over (:meth:`Guard.holds`), else
        once the write landed (see :meth:`_done_elsewhere`)."""
        answered = False
        if outcomes is not None and not chunk.future.done() and (
                all(o["status"] == "ok" for o in outcomes) or self.guard.holds(chunk.binding)):
            chunk.future.set_result(outcomes)
            answered = True
        self._track_write(self._finish_chunk(chunk, outcomes, answered))

    def _track_write(self, write: Coroutine[Any, Any, Any]) -> None:
        """Run a write-down beside the workers (:meth:`stop` waits for it)."""
        task = watch(asyncio.ensure_future(write), "a run-once write-down")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def write_early(self, binding: Binding, written: set[int], items: list[Item],
                    oks: list[Outcome]) -> None:
        """Write down successes of a chunk that still runs (:meth:`Runtime.run_held`):
        those handed over together (by every chunk the runtime looked at) go in one
        write-down per binding."""
        written.update(o["id"] for o in oks)
        if not self._early:
            asyncio.get_running_loop().call_soon(self._flush_early)
        _, pending_items, pending_oks = self._early.setdefault(binding.name, (binding, [], []))
        pending_items += items
        pending_oks += oks

    def _flush_early(self) -> None:
        early, self._early = self._early, {}
        for binding, items, oks in early.values():
            self._track_write(self.finish(binding, items, oks))

    async def _finish_chunk(self, chunk: Chunk, outcomes: list[Outcome] | None,
                            answered: bool) -> None:
        items = chunk.items
        if chunk.written:
            items = [i for i in items if i["id"] not in chunk.written]
        elsewhere = await self.finish(chunk.binding, items, outcomes or [])
        if answered or outcomes is None or chunk.future.done():
            return
        if elsewhere:
            outcomes = self._done_elsewhere(chunk.binding, outcomes, elsewhere)
        chunk.future.set_result(outcomes)

    @staticmethod
    def _done_elsewhere(binding: Binding, outcomes: list[Outcome],
                        elsewhere: set[int]) -> list[Outcome]:
        """``outcomes`` with those of records another copy completed turned ``ok``: this
        scheduler was judged dead while running them, another took them over and they
        succeeded there, so they are done (retrying them would run them again)."""
        metrics.count_run_once(binding.name, "done_elsewhere", len(elsewhere))
        log.warning("binding %s: %d record(s) that failed here had succeeded meanwhile in "
                    "another scheduler, which took them over (this one was judged dead: "
                    "check its link to Redis and its event loop); they are answered ok",
                    binding.name, len(elsewhere), extra={"binding": binding.name})
        return [ok(o["id"]) if o["id"] in elsewhere else o for o in outcomes]
