"""The scheduler's side of the run stream (:mod:`asynctier.platform.stream`).

A :class:`RunSession` takes a stream's items at once (an ``alive`` message naming them all
says so), runs them through :meth:`Scheduler.process` with a report callback (chunks
sized from the binding's time per item: a long item runs alone), sends the outcomes as
each chunk ends, beats ``alive`` for the items it
still holds, and carries the functions' checkpoints to the tailer: ``ctx.checkpoint``
returns once the tailer answered that the checkpoint is stored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import grpc

from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.context import decode_checkpoint
from asynctier.platform.errors import CheckpointError
from asynctier.platform.stream import Message, decode, encode
from asynctier.platform.supervise import watch
from asynctier.platform.wire import Item, Outcome, decode_items, encode_outcomes, retry
from asynctier.scheduler.outcomes import error_text
from asynctier.scheduler.work import StreamItem

if TYPE_CHECKING:
    from asynctier.scheduler.core import Scheduler

log = logging.getLogger(__name__)

#: How long ``ctx.checkpoint`` waits for the tailer's confirmation.
SAVE_TIMEOUT_S = 30.0
#: ... and a worker thread waits this much longer for the loop to answer.
SAVE_GRACE_S = 5.0
#: Items of a run stream that failed in the scheduler come back after this.
ERROR_RETRY_S = 5.0
#: At most this much of an error's text is quoted in a refusal or a log line.
ERROR_EXCERPT = 80
#: Heartbeats asked for are kept within these bounds (seconds).
MIN_BEAT_S, MAX_BEAT_S = 0.05, 10.0
ON_THE_LOOP = ("binding {binding}: ctx.checkpoint blocks, and was called on the event loop "
               "(from an async function?); use `await ctx.acheckpoint(state)` there")


class StreamSaver:
    """One item's :class:`~asynctier.platform.context.Saver`: its checkpoints go on the
    stream, and return once the tailer stored them."""

    def __init__(self, session: RunSession, item_id: int, binding: str) -> None:
        self.session = session
        self.item_id = item_id
        self.binding = binding

    def save(self, state: bytes, kind: str) -> None:
        """From a worker thread: wait for the event loop's save."""
        session = self.session
        if threading.get_ident() == session.loop_thread:
            raise CheckpointError(ON_THE_LOOP.format(binding=self.binding))
        future = asyncio.run_coroutine_threadsafe(self.asave(state, kind), session.loop)
        try:
            future.result(SAVE_TIMEOUT_S + SAVE_GRACE_S)
        except concurrent.futures.CancelledError:
            raise CheckpointError(f"binding {self.binding}: the checkpoint was not saved: the "
                                  "stream to the tailer ended (the item runs again elsewhere)"
                                  ) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CheckpointError(f"binding {self.binding}: no confirmation of the checkpoint "
                                  f"within {SAVE_TIMEOUT_S:g}s") from None

    async def asave(self, state: bytes, kind: str) -> None:
        """On the event loop: send the checkpoint, wait for its confirmation."""
        await self.session.save(self.item_id, self.binding, state, kind)


class RunSession:
    """One run stream on the scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.holding: set[int] = set()  # ids without an outcome sent yet
        self._saves: dict[int, asyncio.Future[str]] = {}
        self._seq = itertools.count(1)

    async def serve(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The messages to send, until every item has its outcome."""
        try:
            data = await anext(requests)
        except StopAsyncIteration:
            return
        try:
            first = decode(data)
            items = self._accept(first)
        except Exception as exc:  # the bytes come from outside: anything may be wrong
            raise BadStream(f"its first message is not a run request "
                            f"({type(exc).__name__}: {str(exc)[:ERROR_EXCERPT]})") from None
        beat_s = min(MAX_BEAT_S, max(MIN_BEAT_S, first.heartbeat_ms / 1000.0))
        # One-shot tasks of this stream, cancelled when it ends; an error is logged (the
        # work's own errors become retry outcomes in _work).
        tasks = [watch(asyncio.create_task(self._work(items)), "a run stream's work"),
                 watch(asyncio.create_task(self._beat(beat_s)),
                       "a run stream's heartbeat (the tailer may take the stream for dead "
                       "and send its items again)"),
                 watch(asyncio.create_task(self._read(requests)),
                       "a run stream's reader of checkpoint answers (its checkpoints then "
                       "wait and fail)")]
        try:
            while (message := await self.out.get()) is not None:
                yield message
        finally:
            await cancel_and_wait(*tasks)

    def _accept(self, first: Message) -> list[Item]:
        """The stream's items, each with its saver and the state it resumes from
        (:class:`~asynctier.scheduler.work.StreamItem`); an ``alive`` message naming them
        all is queued at once (accepted)."""
        items = decode_items(first.body)
        for item in items:
            item.pop("fresh", None)  # a stream is sent again as it is: claimed first
            kept = cast(StreamItem, item)
            saved = first.resume.get(item["id"])
            if saved is not None:
                kept["resumed"] = decode_checkpoint(saved[1], saved[0])
            kept["saver"] = StreamSaver(self, item["id"], item["binding"])
        self.holding = {item["id"] for item in items}
        self._alive()
        return items

    def report(self, outcomes: list[Outcome]) -> None:
        """Send the outcomes not sent yet."""
        fresh = [o for o in outcomes if o["id"] in self.holding]
        if fresh:
            self.holding.difference_update(o["id"] for o in fresh)
            self.out.put_nowait(encode(Message("outcomes", body=encode_outcomes(fresh))))

    async def save(self, item_id: int, binding: str, state: bytes, kind: str) -> None:
        """Send one checkpoint and wait until the tailer stored it; CheckpointError if not."""
        seq = next(self._seq)
        future = self._saves[seq] = self.loop.create_future()
        self.out.put_nowait(encode(Message("checkpoint", seq=seq, item=item_id,
                                           state_kind=kind, state=state)))
        try:
            error = await asyncio.wait_for(future, SAVE_TIMEOUT_S)
        except TimeoutError:
            raise CheckpointError(f"binding {binding}: no confirmation of the checkpoint "
                                  f"within {SAVE_TIMEOUT_S:g}s") from None
        finally:
            self._saves.pop(seq, None)
        if error:
            raise CheckpointError(f"binding {binding}: the checkpoint was not saved: {error}")

    async def _work(self, items: list[Item]) -> None:
        try:
            self.report(await self.scheduler.process(items, self.report))
        except Exception as exc:  # a bug here must not lose the items: they come back
            log.exception("a run stream of %d item(s) failed in the scheduler", len(items))
            self.report([retry(i["id"], f"scheduler error: {error_text(exc)}",
                               spends_attempt=False, after_s=ERROR_RETRY_S) for i in items])
        finally:
            self.out.put_nowait(None)

    async def _beat(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self._alive()

    def _alive(self) -> None:
        if self.holding:
            self.out.put_nowait(encode(Message("alive", ids=sorted(self.holding))))

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        """The tailer's answers to checkpoints."""
        async for data in requests:
            try:
                message = decode(data)
            except Exception as exc:
                log.error("a run stream sent a message that does not decode (%s: %s); its "
                          "later answers to checkpoints are not read (those wait and fail)",
                          type(exc).__name__, str(exc)[:ERROR_EXCERPT])
                return
            future = self._saves.get(message.seq) if message.kind == "saved" else None
            if future is not None and not future.done():
                future.set_result(message.error)


class BadStream(ValueError):
    """A run stream's request is not one (it is answered INVALID_ARGUMENT)."""


def run_handler(scheduler: Scheduler) -> Any:
    """The gRPC method of the run stream for ``scheduler``; a stream whose first message
    is not a run request is refused (INVALID_ARGUMENT), saying why."""
    async def run(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        try:
            async for data in RunSession(scheduler).serve(requests):
                yield data
        except BadStream as exc:
            log.error("a run stream from %s is refused: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"refused: {exc}")
    return run
