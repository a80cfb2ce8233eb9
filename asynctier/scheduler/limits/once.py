"""Run once: a record whose function succeeded is not run again when it is read again.

At-least-once delivery reads a record again after a crash or a rebalance (its offset was
not committed yet), and a retried record can reach a delay topic twice. For a binding that
is not ``idempotent`` (the default) the scheduler guards each record by its ``source_ref``
in Redis (the delay tailers send the record's origin as its ``source_ref``, so every copy
of one record is the same record here):

- before a chunk is queued, one script per batch (:data:`CLAIM`) claims each record for
  this scheduler (``r<holder>``); a record already done (``d``) is answered ``ok``
  without running; a record claimed by a live scheduler (a copy still running there) waits
  until it is done or released; a record claimed by a dead scheduler is taken over;
- after a chunk ran, and before it is answered, one script (:data:`FINISH`) marks the
  successes done for at least ``done_ttl_s`` and frees the rest, so a retry runs again
  (chunks that end while one such write is under way go together in the next); a record
  is freed only while this scheduler's claim is its newest state, and one that another
  copy completed meanwhile is answered ``ok``.

A scheduler is alive while its expiry in the binding's holders
(``<prefix>:{once:<binding>}:holders``, a sorted set: holder -> expiry by Redis ``TIME``)
is ahead: renewed with every claim and by a heartbeat while it holds claims, it lapses
``holder_ttl_s`` after the scheduler dies. Every key of a binding's run-once state carries
the hash tag ``{once:<binding>}``, and every key a script call touches is passed in its
``KEYS`` (:func:`run_once_keys`; the scripts refuse any other): one call, one Redis
Cluster slot, as Redis documents scripts. What this cannot prevent is a function that
succeeded in a scheduler killed before :data:`FINISH` ran: that record runs again (at
least once wins over at most once). The cost is one round trip per batch and one per write,
a little Redis CPU per record and under a byte of Redis memory per success for
``done_ttl_s`` to ``4/3 done_ttl_s`` (the figures are in docs/guarantees.md, Run once): a
binding whose function is idempotent should say so (``asynctier bind --idempotent``) and
skip all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from asynctier.platform import metrics
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.config import DEFAULT_RUN_ONCE_WINDOW_S
from asynctier.platform.errors import ServiceError
from asynctier.platform.names import Names
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis
from asynctier.platform.scripts import lua
from asynctier.platform.supervise import RestartPolicy, supervise_task
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.guard import BUSY, RUN, TAKEN_OVER
from asynctier.scheduler.limits.bad_values import BadValues
from asynctier.scheduler.limits.quota import as_text, join_refs

log = logging.getLogger(__name__)

#: A record's success is remembered this long unless told otherwise (``run_once_window``).
DEFAULT_DONE_TTL_S = DEFAULT_RUN_ONCE_WINDOW_S
#: A scheduler's holder lives this long without a beat (renewed every third of it).
DEFAULT_HOLDER_TTL_S = 5.0
#: Closing waits this long at most for the write-downs under way to land.
CLOSE_WAIT_S = 5.0
#: CLAIM's code for a record this scheduler claims already (never returned by :class:`RunOnce`).
MINE: Final = "4"

#: Records are kept per binding per span of ``done_ttl_s / 3``, under
#: ``<prefix>:{once:<binding>}:<span number>``:
#:
#: - claims in a hash at that key: field the source reference, value ``r<holder>``; a
#:   record's claim is deleted when it ends (done or freed), so the hash holds only the
#:   records running;
#: - successes of a Kafka record (a reference ``<topic>/<partition>/<offset>``) as one bit
#:   in a bitmap per block of :data:`BLOCK` offsets, at ``<key>:<topic>/<partition>:<block>``:
#:   about a bit per record, where a field per success made a busy binding's window
#:   weigh gigabytes (and every AOF rewrite wrote it all out);
#: - the success of any other reference as the value ``d`` of its hash field.
#:
#: A record is done when a kept span has its bit or its ``d``; else its state is its claim
#: in the newest of the last :data:`SPANS_KEPT` hashes that has one (no field: free).
#: Writes go to the current span, whose keys expire one span after the last one kept. A
#: batch is read with one HMGET per hash and one GET per bitmap, and written with one HSET
#: per hash and one GETRANGE and SETRANGE per bitmap.
SPANS_KEPT: Final = 4
#: Offsets per done-bitmap: at most 1 KiB each, however sparse the offsets that succeed.
BLOCK: Final = 8192
#: A field of every run-once hash (a line break: no reference is one, since references
#: travel one per line, escaped when they hold one) whose value, longer than Redis'
#: ``hash-max-listpack-value`` (64 by default), makes Redis keep the hash as a hash table
#: from its first write. Left to itself Redis keeps a hash of up to
#: ``hash-max-listpack-entries`` (512) fields as a flat list searched from the start, and a
#: scheduler's claims are a few hundred records: each HMGET, HSET or HDEL of a batch then
#: walked the list, about twice the Redis CPU per record of a table
#: (``python -m bench.once_cost --batch 300`` shows whether it still pays).
HT_FIELD: Final = "\n"
HT_PAD: Final = 512

#: What a script answers, instead of its codes, when the span of Redis ``TIME`` is not one
#: of those whose keys it was given (the span follows): asked again once with that span.
SKEW: Final = "S"

_CONSTANTS: Final = {"SPANS_KEPT": SPANS_KEPT, "BLOCK": BLOCK, "HT_PAD": HT_PAD}
#: Claim every record of a batch for one holder (``lua/once_claim.lua``).
CLAIM: Final = lua("once_lib", "once_claim", **_CONSTANTS)
#: Mark a chunk's successes done and free the others (``lua/once_finish.lua``).
FINISH: Final = lua("once_lib", "once_finish", **_CONSTANTS)
#: Renew a holder (``lua/once_beat.lua``).
BEAT: Final = lua("once_lib", "once_beat", **_CONSTANTS)
#: Say that fresh records run here, one range per partition (``lua/once_range.lua``).
RANGE: Final = lua("once_lib", "once_range", **_CONSTANTS)


#: A reference's bitmap block: ``(topic/partition, block)``, or None (no bit: a ``d``).
Block = tuple[str, int] | None


def kafka_offset(ref: str) -> tuple[str, int] | None:
    """A Kafka reference's partition (``<topic>/<partition>``) and offset, or None: the
    rule of ``kafka_offset`` in ``lua/once_lib.lua`` (``^(.*)/(%d+)$``, at most 15 ASCII
    digits, no leading zero; a property test holds the two together). Only such a
    reference has a done bit, and only such a record can be in a running range."""
    where, slash, offset = ref.rpartition("/")
    if (slash and offset.isdigit() and offset.isascii() and len(offset) <= 15
            and (len(offset) == 1 or offset[0] != "0")):
        return where, int(offset)
    return None


def each_block(joined: str) -> list[Block]:
    """The bitmap block of each reference in references joined as a script gets them
    (:func:`~.quota.join_refs`; see :func:`kafka_offset`)."""
    blocks: list[Block] = []
    for ref in joined.split("\n"):
        found = kafka_offset(ref)
        blocks.append(None if found is None else (found[0], found[1] // BLOCK))
    return blocks


def blocks_of(*joined: str) -> set[tuple[str, int]]:
    """The distinct bitmap blocks of the references ``joined`` (see :func:`each_block`)."""
    return {b for text in joined for b in each_block(text) if b is not None}


def runs_of(offsets: dict[str, list[int]]) -> str:
    """Offsets by partition as once_finish.lua's runs: ``<where>\t<lo>\t<hi>`` per line,
    one line per run of consecutive offsets (a chunk of a partition is usually one)."""
    lines = []
    for where, each in offsets.items():
        each.sort()
        lo = prev = each[0]
        for offset in each:
            if offset > prev + 1:
                lines.append(f"{where}\t{lo}\t{prev}")
                lo = offset
            prev = offset
        lines.append(f"{where}\t{lo}\t{prev}")
    return "\n".join(lines)


def failure_runs(failed: dict[str, tuple[list[int], list[str]]]) -> tuple[str, list[str]]:
    """Fresh failures (per partition, their offsets and refs) as once_finish.lua's runs
    (:func:`runs_of`), and their refs in the order of the codes it answers."""
    offsets: dict[str, list[int]] = {}
    refs: list[str] = []
    for where, (each, names) in failed.items():
        pairs = sorted(zip(each, names, strict=True))
        offsets[where] = [offset for offset, _ in pairs]
        refs += [ref for _, ref in pairs]
    return runs_of(offsets), refs


def run_once_keys(holders: str, prefix: str, span: int, *joined: str) -> list[str]:
    """The KEYS of a claim or finish of the references ``joined`` (as in its ARGV) when
    this scheduler's span is ``span`` (see :func:`keys_of`)."""
    return keys_of(holders, prefix, span, blocks_of(*joined))


def keys_of(holders: str, prefix: str, span: int,
            blocks: set[tuple[str, int]]) -> list[str]:
    """The KEYS of a claim or finish touching the bitmaps ``blocks`` when this scheduler's
    span is ``span``: the holders, the span hashes of spans ``span - SPANS_KEPT`` to
    ``span + 1`` (Redis' span may be one off either way), the bitmaps of the blocks in
    those spans and the running keys of their partitions (the names the scripts build:
    ``<prefix><span>``, ``<prefix><span>:<topic/partition>:<block>`` and
    ``<prefix>running:<topic/partition>``)."""
    spans = range(span - SPANS_KEPT, span + 2)
    return [holders, *(f"{prefix}{s}" for s in spans),
            *(f"{prefix}{s}:{where}:{block}" for where, block in blocks for s in spans),
            *(f"{prefix}running:{where}" for where in {where for where, _ in blocks})]


class RunningRange:
    """The fresh records of one call and partition running here (``<lo>:<hi>:<holder>``
    in Redis), and how many of them have not been written down yet."""

    __slots__ = ("hi", "left", "line", "lo", "where")

    def __init__(self, where: str, offset: int) -> None:
        self.where = where
        self.lo = self.hi = offset
        self.left = 0
        self.line = ""  # as the scripts name it: <where>\t<lo>:<hi>:<holder>


@dataclasses.dataclass
class Pending:
    """A binding's write-down to come: the refs done and free, the offsets of fresh
    successes by partition and fresh failures by partition, the running ranges to
    remove, and the bitmap blocks its keys need (known, or to work out from refs)."""

    done: list[str] = dataclasses.field(default_factory=list)
    fresh_done: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: fresh failures by partition: their offsets, and their refs in the same order
    fresh_free: dict[str, tuple[list[int], list[str]]] = dataclasses.field(
        default_factory=dict)
    free: list[str] = dataclasses.field(default_factory=list)
    ended: list[str] = dataclasses.field(default_factory=list)
    blocks: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    unknown: list[str] = dataclasses.field(default_factory=list)


def _settle(waiters: list[asyncio.Future[set[str]]], result: set[str] | None = None,
            exception: Exception | None = None) -> None:
    """Answer the ``finish()`` calls waiting on a write."""
    for waiter in waiters:
        if waiter.done():
            continue
        if exception is not None:
            waiter.set_exception(exception)
        else:
            waiter.set_result(result or set())


class RunOnce:
    """Claims records for this scheduler and remembers the ones that succeeded."""

    def __init__(self, client: AsyncRedis, names: Names,
                 done_ttl_s: float = DEFAULT_DONE_TTL_S,
                 holder_ttl_s: float = DEFAULT_HOLDER_TTL_S,
                 clock: Callable[[], float] = time.time,
                 policy: RestartPolicy | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._policy = policy  # how its loops restart after a failure (tests shorten it)
        self._names = names
        self._claim = client.register_script(CLAIM)
        self._finish = client.register_script(FINISH)
        self._beat_script = client.register_script(BEAT)
        self._range = client.register_script(RANGE)
        self.holder = uuid.uuid4().hex[:12]
        self._span_ms = max(1, int(done_ttl_s * 1000 / (SPANS_KEPT - 1)))
        self._clock = clock
        self._skew = 0  # Redis' span minus this clock's, as last learned
        self._holder_ms = int(holder_ttl_s * 1000)
        self._monotonic = monotonic
        # per binding: until when (monotonic) this holder is surely alive in Redis: its
        # last renewal's send time plus two thirds of its life (see holds())
        self._held_until: dict[str, float] = {}
        # per binding: refs claimed and not finished, with their bitmap block (worked out
        # once, at the claim: the write-down's KEYS need it again)
        self._running: dict[str, dict[str, Block]] = {}
        # per binding and partition: the running ranges of fresh records here (a fresh
        # item carries its range: nothing is kept per record)
        self._ranges: dict[str, dict[str, set[RunningRange]]] = {}  # binding -> where -> live
        self._heartbeat: asyncio.Task[None] | None = None
        # chunks ended and not yet written: per binding, the done and the free refs and
        # the running ranges to remove
        self._pending: dict[str, Pending] = {}
        # per binding, the finish() calls waiting for the next write to land
        self._waiters: dict[str, list[asyncio.Future[set[str]]]] = {}
        self._writer: asyncio.Task[None] | None = None
        self._write_wanted = asyncio.Event()  # chunks are pending
        self._idle = asyncio.Event()  # nothing pending, no write under way
        self._idle.set()
        self._bad = BadValues(log)

    def prefix(self, binding: str) -> str:
        """The prefix of ``binding``'s hashes (the span number follows)."""
        return self._names.once_key(binding, "")

    def holders(self, binding: str) -> str:
        """The key of ``binding``'s holders (sorted set: holder -> expiry, epoch ms)."""
        return self._names.once_key(binding, "holders")

    async def _call(self, script: Any, binding: str, blocks: set[tuple[str, int]],
                    args: list[str | int]) -> str:
        """Run a claim or finish touching the bitmaps ``blocks`` with the keys of this
        clock's span; asked again once with Redis' span when that is another (see
        :data:`SKEW`)."""
        mine = int(self._clock() * 1000) // self._span_ms
        span = mine + self._skew
        for _ in range(2):
            keys = keys_of(self.holders(binding), self.prefix(binding), span, blocks)
            text = as_text(await script(keys=keys, args=args))
            if not text.startswith(SKEW):
                return text
            span = int(text[len(SKEW):])
            self._skew = span - mine
        raise ServiceError(
            f"run-once of binding {binding}: Redis' clock (TIME) moved to another span twice "
            "within one call; check the clocks of the Redis server and of this scheduler")

    def holds(self, binding: str) -> bool:
        """Whether this scheduler's holder of ``binding`` is surely alive in Redis now: a
        renewal (a claim, a range write or a beat) was sent less than two thirds of its
        life ago, so no other scheduler can have taken its records over, and no failure
        here can have succeeded in another copy meanwhile."""
        return self._monotonic() < self._held_until.get(binding, float("-inf"))

    def _renewed(self, binding: str, sent: float) -> None:
        until = sent + self._holder_ms / 1000 * 2 / 3
        if until > self._held_until.get(binding, float("-inf")):
            self._held_until[binding] = until

    async def claim(self, binding: str, items: Sequence[Item]) -> str:
        """One code per item (see :data:`RUN` and the others)."""
        if not items:
            return ""
        refs = [item["source_ref"] for item in items]
        joined = join_refs(refs)
        blocks = each_block(joined)
        sent = self._monotonic()
        text = await self._call(self._claim, binding, {b for b in blocks if b is not None}, [
            self.holder, self._holder_ms, self._span_ms, self.prefix(binding), joined])
        self._renewed(binding, sent)
        text, _, refused = text.partition("\n")
        if refused:
            self._refused(binding, refused)
        running = self._running.setdefault(binding, {})
        if text.count(RUN) == len(text):
            running.update(zip(refs, blocks, strict=True))
        else:
            out = []
            for ref, block, code in zip(refs, blocks, text, strict=True):
                if code == MINE:  # running here: wait for it; else a claim left behind
                    code = BUSY if self._runs_here(binding, ref) else RUN
                if code in (RUN, TAKEN_OVER):
                    running[ref] = block
                out.append(code)
            text = "".join(out)
        self._ensure_heartbeat()
        return text

    def run_fresh(self, binding: str, items: Sequence[Item]
                  ) -> tuple[list[Item], Callable[[], Awaitable[None]] | None]:
        """Take fresh ``items`` as running here without a claim each (docs/design.md, Run
        once off the path): one running range per partition, which each item carries
        (``item["fresh"]``, with its offset: ``(range, offset)``); nothing is kept per
        record. Items that cannot be in a range (no Kafka offset, running here already,
        not after the last offset of its partition in the batch - a second copy, or out
        of order - or in a partition whose range would overlap one running here) are
        returned, to be claimed as any record, with the write of the ranges for the
        caller to make beside the run; :meth:`finish` removes a range with its last
        record."""
        running = self._running.get(binding)
        others: list[Item] = []
        spans: dict[str, RunningRange] = {}
        for item in items:
            ref = item["source_ref"]
            found = kafka_offset(ref)
            if found is not None and not (running and ref in running):
                where, offset = found
                span = spans.get(where)
                if span is None:
                    span = spans[where] = RunningRange(where, offset)
                elif offset > span.hi:
                    span.hi = offset
                else:
                    others.append(item)
                    continue
                span.left += 1
                item["fresh"] = (span, offset)
                continue
            others.append(item)
        live = self._ranges.setdefault(binding, {})
        for where, span in list(spans.items()):
            if any(span.lo <= other.hi and other.lo <= span.hi for other in live.get(where, ())):
                del spans[where]  # a copy of one of them may run here: all are claimed
                for item in items:
                    mark = item.get("fresh")
                    if mark.__class__ is tuple and mark[0] is span:
                        item["fresh"] = True
                        others.append(item)
        if not spans:
            return others, None
        for where, span in spans.items():
            span.line = f"{where}\t{span.lo}:{span.hi}:{self.holder}"
            live.setdefault(where, set()).add(span)
        self._ensure_heartbeat()
        lines = "\n".join(span.line for span in spans.values())
        keys = [self.holders(binding),
                *(f"{self.prefix(binding)}running:{where}" for where in spans)]
        return others, functools.partial(self._write_ranges, binding, keys, lines)

    async def _write_ranges(self, binding: str, keys: list[str], lines: str) -> None:
        sent = self._monotonic()
        text = as_text(await self._range(keys=keys, args=[
            self.holder, self._holder_ms, self._span_ms * (SPANS_KEPT + 1),
            self.prefix(binding), lines]))
        self._renewed(binding, sent)
        _, _, refused = text.partition("\n")
        if refused:
            self._refused(binding, refused)

    def _ended(self, binding: str, items: Sequence[Item], ok: set[int] | None = None,
               pending: Pending | None = None) -> list[Item]:
        """Of ``items``, those that were not in a running range. With ``pending``, the
        others' successes (their ids in ``ok``) go to its offsets, their failures to its
        fresh failures, the ranges whose last record is among them to its ranges to remove and
        the bitmap blocks of their ranges to its blocks. An item is ended once: it then
        carries ``True`` again."""
        rest: list[Item] = []
        spans: set[RunningRange] = set()
        done = pending.fresh_done if pending is not None else {}
        for item in items:
            mark = item.get("fresh")
            if mark.__class__ is not tuple:
                rest.append(item)
                continue
            item["fresh"] = True
            span, offset = mark
            spans.add(span)
            span.left -= 1
            if pending is not None:
                if ok is not None and item["id"] in ok:
                    if (offsets := done.get(span.where)) is None:
                        offsets = done[span.where] = []
                    offsets.append(offset)
                else:
                    if (failed := pending.fresh_free.get(span.where)) is None:
                        failed = pending.fresh_free[span.where] = ([], [])
                    failed[0].append(offset)
                    failed[1].append(item["source_ref"])
            if not span.left:
                self._ranges[binding][span.where].discard(span)
                if pending is not None:
                    pending.ended.append(span.line)
        if pending is not None:
            for span in spans:
                pending.blocks.update((span.where, b)
                                      for b in range(span.lo // BLOCK, span.hi // BLOCK + 1))
        return rest

    def _runs_here(self, binding: str, ref: str) -> bool:
        """Whether ``ref`` is claimed here, or inside a running range of this scheduler."""
        if ref in self._running.get(binding, {}):
            return True
        found = kafka_offset(ref)
        if found is None:
            return False
        where, offset = found
        return any(r.lo <= offset <= r.hi for r in self._ranges.get(binding, {}).get(where, ()))

    def _refused(self, binding: str, refused: str) -> None:
        """Say once each value CLAIM refused: a record's value that is neither ``d`` nor
        ``r<holder>`` (the record ran, and its claim replaced the value) or a holder's
        expiry no heartbeat sets (the holder was dropped, its records taken over)."""
        for line in refused.split("\n"):
            key, value, field = line.split("\t", 2)
            if key == self.holders(binding):
                why = ("an expiry no heartbeat sets (its records would wait for ever); the "
                       "holder was dropped and its records taken over")
            elif field == "range":
                why = "not a running range (<lo>:<hi>:<holder>); it was removed"
            else:
                why = ("neither d (done) nor r<holder> (claimed); the record ran, its claim "
                       "replacing the value")
            self._bad.refused(key, field, value, why, "nothing to do (or delete the key)",
                              binding=binding)

    def forget(self, binding: str, items: Sequence[Item]) -> None:
        """``items`` no longer run here (their claims, if still in Redis, are stale; their
        ranges lapse with this holder)."""
        self._not_running(binding, items)
        self._ended(binding, items)  # the ranges lapse with this holder

    def _not_running(self, binding: str, items: Sequence[Item]) -> None:
        running = self._running.get(binding)
        if running:
            for item in items:
                running.pop(item["source_ref"], None)

    async def finish(self, binding: str, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> set[int]:
        """Mark the items whose outcome is ``ok`` done and free the others; return once
        Redis has it, with the ids of the items that did not succeed here but were done
        meanwhile by another copy (taken over from this scheduler: see :data:`FINISH`).

        Chunks that end while a write is under way are written together by the next one:
        one round trip per write whatever the number of chunks (a round trip costs this
        process more CPU than the records it carries), and a chunk waits at most one
        round trip more than its own.
        """
        ok = {o["id"] for o in outcomes if o["status"] == "ok"}
        pending = self._pending.get(binding)
        if pending is None:
            pending = self._pending[binding] = Pending()
        claimed = self._ended(binding, items, ok, pending)
        self._blocks(binding, claimed, pending)
        done, free = pending.done, pending.free
        for item in claimed:
            (done if item["id"] in ok else free).append(item["source_ref"])
        waiter: asyncio.Future[set[str]] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(binding, []).append(waiter)
        self._idle.clear()
        self._write_wanted.set()
        if self._writer is None:
            self._writer = supervise_task(
                "asynctier-once-writer", self._writes, policy=self._policy,
                what="the run-once writer (write-downs of the chunks that ran)",
                hint="Chunks wait for their write-down meanwhile; check Redis and the error "
                     "above.", on_restart=metrics.count_task_restart)
        try:
            elsewhere = await waiter
        finally:
            # Only now: until the write lands, a copy read again meanwhile finds this
            # scheduler's claim and must wait for it (not run beside a success unwritten).
            self._not_running(binding, items)  # (their ranges ended above)
        if not elsewhere:
            return set()
        return {item["id"] for item in items
                if item["id"] not in ok and item["source_ref"] in elsewhere}

    async def _writes(self) -> None:
        """The writer's loop (supervised): write whenever chunks are pending."""
        while True:
            if not self._pending:
                self._idle.set()
                await self._write_wanted.wait()
            self._write_wanted.clear()
            await self._write()

    async def _write(self) -> None:
        """Write the pending chunks, binding by binding, until none is left; each binding's
        waiters learn how its own write went (one binding's broken keys fail only its
        chunks; Redis out of reach fails every binding still to write)."""
        while self._pending:
            pending, self._pending = self._pending, {}
            waiters, self._waiters = self._waiters, {}
            try:
                await self._write_each(pending, waiters)
            except BaseException as exc:  # whatever ends the writer: no waiter waits on
                failed = RuntimeError(f"the run-once write failed: {exc!r}")
                for rest in waiters.values():
                    _settle(rest, exception=failed)
                raise

    async def _write_each(self, pending: dict[str, Pending],
                          waiters: dict[str, list[asyncio.Future[set[str]]]]) -> None:
        """One write per binding of ``pending``, each settling its ``waiters``."""
        down: Exception | None = None
        for binding, each in pending.items():
            done, free = each.done, each.free
            mine = waiters.pop(binding, [])
            if down is not None:
                _settle(mine, exception=down)
                continue
            try:
                done_text = join_refs(done) if done else ""
                free_text = join_refs(free) if free else ""
                failed, fresh_free = failure_runs(each.fresh_free)
                args: list[str | int] = [
                    self._span_ms, self.prefix(binding), done_text, free_text, self.holder,
                    "\n".join(each.ended), runs_of(each.fresh_done), failed]
                blocks = each.blocks
                if each.unknown:
                    blocks |= blocks_of(join_refs(each.unknown))
                text = await self._call(self._finish, binding, blocks, args)
                elsewhere = ({ref for ref, code in zip([*free, *fresh_free], text, strict=True)
                              if code == "1"} if "1" in text else set())
            except Exception as exc:
                if isinstance(exc, REDIS_DOWN):
                    down = exc
                _settle(mine, exception=exc)
                continue
            except BaseException:  # cancelled: every binding still waiting learns it
                cancelled = RuntimeError("the write was cancelled")
                for rest in (mine, *waiters.values()):
                    _settle(rest, exception=cancelled)
                raise
            _settle(mine, result=elsewhere)

    def _blocks(self, binding: str, items: list[Item], pending: Pending) -> None:
        """Add the bitmap blocks of claimed ``items`` to ``pending``: from their claims, or
        left to work out for those not claimed here (run unguarded while Redis was away)."""
        running = self._running.get(binding, {})
        for item in items:
            ref = item["source_ref"]
            if ref not in running:
                pending.unknown.append(ref)
            elif (block := running[ref]) is not None:
                pending.blocks.add(block)

    async def close(self) -> None:
        """Stop the heartbeat and the writer (once the writes under way landed, for at
        most :data:`CLOSE_WAIT_S`) and drop this holder: claims left here are free at
        once."""
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
        if self._writer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self._idle.wait()
            await cancel_and_wait(self._writer)
            self._writer = None
        for binding in {*self._running, *self._ranges}:  # one key at a time: own slots
            try:
                await self._client.zrem(self.holders(binding), self.holder)
            except REDIS_DOWN:
                return  # Redis is away: this holder's expiries lapse by themselves

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = supervise_task(
                "asynctier-once-heartbeat", self._beats, policy=self._policy,
                what="the run-once heartbeat (this scheduler's holder)",
                hint="Other schedulers take over this one's records if it lapses; check "
                     "Redis and the error above.", on_restart=metrics.count_task_restart)

    async def _beats(self) -> None:
        """The heartbeat's loop (supervised): renew this holder of every binding it holds
        claims of, every third of the holder's life."""
        while True:
            await asyncio.sleep(self._holder_ms / 3000)
            for binding in {*(b for b, refs in self._running.items() if refs),
                            *(b for b, live in self._ranges.items() if any(live.values()))}:
                await self._beat(binding)

    async def _beat(self, binding: str) -> None:
        sent = self._monotonic()
        try:
            text = as_text(await self._beat_script(keys=[self.holders(binding)],
                                                   args=[self.holder, self._holder_ms]))
        except REDIS_DOWN as exc:
            log.debug("could not renew the run-once holder of %s: %s", binding, exc)
            return
        self._renewed(binding, sent)
        _, _, refused = text.partition("\n")
        if refused:
            self._refused(binding, refused)
