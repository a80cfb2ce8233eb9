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

A scheduler is alive while its holder key (``<prefix>:once-holder:<holder>``) exists: set
with every claim and renewed by a heartbeat while it holds claims, it expires
``holder_ttl_s`` after the scheduler dies. What this cannot prevent is a function that
succeeded in a scheduler killed before :data:`FINISH` ran: that record runs again (at
least once wins over at most once). The cost is one round trip per batch and one per write,
about 3 µs of Redis CPU per record (claimed, run and written down; ``python -m
bench.once_cost --batch 300``: 3.0-3.6, against 6.7-7.9 before the claims hash was kept as
a hash table, see :data:`HT_FIELD`), and under a byte of Redis memory per success for
``done_ttl_s`` to ``4/3 done_ttl_s`` (0.3 bytes of ``used_memory`` per success; a hash
field per success, as before the bitmaps, cost 83 bytes): a binding whose function is
idempotent should say so (``asynctier bind --idempotent``) and skip all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Final

from redis.asyncio import Redis

from asynctier.platform.admission import BUSY, RUN, TAKEN_OVER
from asynctier.platform.cancel import cancel_and_wait
from asynctier.platform.config import DEFAULT_RUN_ONCE_WINDOW_S
from asynctier.platform.limits.outage import REDIS_DOWN
from asynctier.platform.limits.quota import as_text, join_refs
from asynctier.platform.names import Names
from asynctier.platform.wire import Item, Outcome

log = logging.getLogger(__name__)

#: A record's success is remembered this long unless told otherwise (``run_once_window``).
DEFAULT_DONE_TTL_S = DEFAULT_RUN_ONCE_WINDOW_S
#: A scheduler's holder key lives this long without a beat (renewed every third of it).
DEFAULT_HOLDER_TTL_S = 5.0
#: CLAIM's code for a record this scheduler claims already (never returned by :class:`RunOnce`).
MINE: Final = "4"

#: Records are kept per binding per span of ``done_ttl_s / 3``, under
#: ``<prefix>:once:<binding>:<span number>``:
#:
#: - claims in a hash at that key: field the source reference, value ``r<holder>``; a
#:   record's claim is deleted when it ends (done or freed), so the hash holds only the
#:   records running;
#: - successes of a Kafka record (a reference ``<topic>/<partition>/<offset>``) as one bit
#:   in a bitmap per block of :data:`BLOCK` offsets, at ``<key>:<topic>/<partition>:<block>``:
#:   about a bit per record where a hash field cost 80-100 bytes (at 60,000 records/s a
#:   15-minute window was 5 GB of Redis memory, and every AOF rewrite wrote it all out);
#: - the success of any other reference as the value ``d`` of its hash field (as every
#:   success was before; such fields are still read).
#:
#: A record is done when a kept span has its bit or its ``d``; else its state is its claim
#: in the newest of the last :data:`SPANS_KEPT` hashes that has one (no field, or ``f``,
#: which older versions wrote: free). Writes go to the current span, whose keys expire one
#: span after the last one kept. A batch is read with one HMGET per hash and one GET per
#: bitmap, and written with one HSET per hash and one GETRANGE and SETRANGE per bitmap.
SPANS_KEPT: Final = 4
#: Offsets per done-bitmap: at most 1 KiB each, however sparse the offsets that succeed.
BLOCK: Final = 8192
#: A field of every run-once hash (a line break: no reference is one, since references
#: travel one per line, escaped when they hold one) whose value, longer than Redis'
#: ``hash-max-listpack-value`` (64 by default), makes Redis keep the hash as a hash table
#: from its first write. Left to itself Redis keeps a hash of up to
#: ``hash-max-listpack-entries`` (512) fields as a flat list searched from the start, and a
#: scheduler's claims are a few hundred records: each HMGET, HSET or HDEL of a batch then
#: walked the list (``python -m bench.once_cost --batch 300``: 6.7-7.9 us of Redis CPU
#: per record that way, 3.0-3.6 as a table).
HT_FIELD: Final = "\n"
HT_PAD: Final = 512

# Both scripts: split a newline-joined argument, and the time now (ms) from Redis TIME.
_PRELUDE = """
local function split(text)
  local out = {}
  if text == '' then return out end
  local start = 1
  while start <= #text + 1 do
    local stop = string.find(text, '\\n', start, true) or (#text + 1)
    out[#out + 1] = string.sub(text, start, stop - 1)
    start = stop + 1
  end
  return out
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: A record's state: its value in the newest of the last SPANS_KEPT hashes that has one.
_NEWEST = f"""
local function newest(prefix, cur, refs)
  local n = #refs
  local state = {{}}
  local found = 0
  for b = cur, cur - {SPANS_KEPT - 1}, -1 do
    if found == n then break end
    local key = prefix .. b
    if redis.call('EXISTS', key) == 1 then
      for s = 1, n, 1000 do
        local e = math.min(s + 999, n)
        local got = redis.call('HMGET', key, unpack(refs, s, e))
        for i = s, e do
          if state[i] == nil and got[i - s + 1] then
            state[i] = got[i - s + 1]
            found = found + 1
          end
        end
      end
    end
  end
  return state
end
"""

_WRITE = f"""
-- A hash written here is a hash table from the start (see HT_FIELD); one left holding that
-- field alone is deleted (an older version's hash has no such field: its last field stays).
local function write(key, pairs, ttl)
  if #pairs == 0 then return end
  redis.call('HSET', key, '\\n', string.rep('-', {HT_PAD}))
  for s = 1, #pairs, 2000 do
    redis.call('HSET', key, unpack(pairs, s, math.min(s + 1999, #pairs)))
  end
  redis.call('PEXPIRE', key, ttl)
end

local function drop_if_bare(key)
  if redis.call('HLEN', key) == 1 and redis.call('HEXISTS', key, '\\n') == 1 then
    redis.call('DEL', key)
  end
end
"""

#: Done bits. ``by_block(refs)``: the Kafka references grouped by bitmap
#: (``<topic>/<partition>:<block>``) with their bits, and the others (no offset, an offset
#: with a leading zero, or one too long for a Lua number to hold exactly). ``done_bits``:
#: which of ``refs`` have their bit in a kept span. ``set_done``: set the bits of ``refs``
#: in the current span; returns the references placed and the others.
_BITS = f"""
local match, byte, floor, tonumber = string.match, string.byte, math.floor, tonumber
local band, bor, rshift = bit.band, bit.bor, bit.rshift

-- Kafka references grouped by bitmap: a list of {{where, list of index, bit, ...}}, and
-- the indexes of the other references.
local function by_block(refs)
  local tps, order, rest = {{}}, {{}}, {{}}
  local last_tp, blocks
  for i = 1, #refs do
    local tp, off = match(refs[i], '^(.*)/(%d+)$')
    if tp and #off <= 15 and (#off == 1 or byte(off, 1) ~= 48) then
      off = tonumber(off)
      local block = floor(off / {BLOCK})
      if tp ~= last_tp then
        blocks = tps[tp]
        if not blocks then
          blocks = {{}}
          tps[tp] = blocks
        end
        last_tp = tp
      end
      local l = blocks[block]
      if not l then
        l = {{}}
        blocks[block] = l
        order[#order + 1] = {{tp .. ':' .. block, l}}
      end
      l[#l + 1] = i
      l[#l + 1] = off - block * {BLOCK}
    else
      rest[#rest + 1] = i
    end
  end
  return order, rest
end

-- Which of refs (of those at the indexes in ``only``, when given) have their bit set.
local function done_bits(prefix, cur, refs, only)
  local done = {{}}
  local picked = refs
  if only then
    picked = {{}}
    for k, i in ipairs(only) do picked[k] = refs[i] end
  end
  local order = by_block(picked)
  for _, group in ipairs(order) do
    local l = group[2]
    for s = cur, cur - {SPANS_KEPT - 1}, -1 do
      local bits = redis.call('GET', prefix .. s .. ':' .. group[1])
      if bits then
        for j = 1, #l, 2 do
          local b = l[j + 1]
          local got = byte(bits, floor(b / 8) + 1)
          if got and band(got, rshift(128, b % 8)) ~= 0 then
            done[only and only[l[j]] or l[j]] = true
          end
        end
      end
    end
  end
  return done
end

local function set_done(prefix, cur, refs, ttl)
  local order, rest = by_block(refs)
  local placed, others = {{}}, {{}}
  for _, group in ipairs(order) do
    local l = group[2]
    local key = prefix .. cur .. ':' .. group[1]
    local bytes, lo, hi = {{}}, {BLOCK}, -1
    for j = 1, #l, 2 do
      placed[#placed + 1] = refs[l[j]]
      local b = l[j + 1]
      local k = floor(b / 8)
      bytes[k] = bor(bytes[k] or 0, rshift(128, b % 8))
      if k < lo then lo = k end
      if k > hi then hi = k end
    end
    -- the bytes touched, read, ORed and written back in one piece (at most BLOCK / 8)
    local old = redis.call('GETRANGE', key, lo, hi)
    local out = {{}}
    for k = lo, hi do
      out[#out + 1] = bor(byte(old, k - lo + 1) or 0, bytes[k] or 0)
    end
    redis.call('SETRANGE', key, lo, string.char(unpack(out)))
    redis.call('PEXPIRE', key, ttl)
  end
  for _, i in ipairs(rest) do others[#others + 1] = refs[i] end
  return placed, others
end
"""

#: Claim every record of a batch for one holder.
#:
#: ARGV[1]  the holder (this scheduler)
#: ARGV[2]  the holder keys' prefix (a holder is alive while prefix .. holder exists)
#: ARGV[3]  milliseconds a holder key lives
#: ARGV[4]  milliseconds a span lasts
#: ARGV[5]  the binding's hashes' prefix
#: ARGV[6]  the batch's source references, in order, joined by newlines
#: Returns  one code per record (RUN, DONE, BUSY, TAKEN_OVER: see
#:          :mod:`asynctier.platform.admission`; and
#:          4 for a record this holder claims already, which :class:`RunOnce` tells apart)
CLAIM: Final = _PRELUDE + _NEWEST + _WRITE + _BITS + f"""
local me = ARGV[1]
local holders = ARGV[2]
redis.call('SET', holders .. me, '1', 'PX', ARGV[3])
local span = tonumber(ARGV[4])
local prefix = ARGV[5]
local refs = split(ARGV[6])
local n = #refs
local cur = math.floor(now / span)
local state = newest(prefix, cur, refs)
local done = done_bits(prefix, cur, refs)
local mine = 'r' .. me
local codes = {{}}
local claims = {{}}
local alive = {{}}
local seen = {{}}
for i = 1, n do
  local v = done[i] and 'd' or state[i]
  if seen[refs[i]] then
    codes[i] = '2'  -- a second copy in this batch waits for the first
  elseif not v or v == 'f' then
    codes[i] = '0'
  elseif v == 'd' then
    codes[i] = '1'
  elseif v == mine then
    codes[i] = '4'  -- this scheduler's: running here, or a claim it could not free
  else
    local holder = string.sub(v, 2)
    local live = alive[holder]
    if live == nil then
      live = redis.call('EXISTS', holders .. holder) == 1
      alive[holder] = live
    end
    codes[i] = live and '2' or '3'
  end
  seen[refs[i]] = true
  if codes[i] == '0' or codes[i] == '3' then
    claims[#claims + 1] = refs[i]
    claims[#claims + 1] = mine
  end
end
write(prefix .. cur, claims, span * {SPANS_KEPT + 1})
return table.concat(codes)
"""

#: Mark a chunk's successes done and free its other records (a retry runs again): their
#: fields are deleted, so failures cost Redis no memory.
#:
#: A record is freed only while this holder's claim is its newest state: a scheduler judged
#: dead (its holder key expired while it still ran the record) must not free a record that
#: another scheduler took over, nor undo the success that one had. Such a record is left
#: as it is and reported: when another copy already succeeded (``d``), this copy's failure
#: is answered ``ok`` (the record is done) instead of retried, and it does not run again.
#:
#: ARGV[1]  milliseconds a span lasts
#: ARGV[2]  the binding's hashes' prefix
#: ARGV[3]  the successes' references joined by newlines ('' for none)
#: ARGV[4]  the others' references joined by newlines ('' for none)
#: ARGV[5]  the holder (this scheduler)
#: Returns  one code per other record: '1' done by another copy, '0' otherwise
FINISH: Final = _PRELUDE + _NEWEST + _WRITE + _BITS + f"""
local span = tonumber(ARGV[1])
local prefix = ARGV[2]
local cur = math.floor(now / span)
local mine = 'r' .. ARGV[5]
local free = split(ARGV[4])
local n = #free
local state = newest(prefix, cur, free)
-- A record still claimed by this holder has no bit: setting a bit deletes every claim of
-- its record, and no record with a bit is claimed. Only the others are looked up (in a
-- retry flood, none).
local others_at = {{}}
for i = 1, n do
  if state[i] ~= mine then others_at[#others_at + 1] = i end
end
local done = #others_at > 0 and done_bits(prefix, cur, free, others_at) or {{}}
local gone = {{}}
local codes = {{}}
for i = 1, n do
  local v = done[i] and 'd' or state[i]
  if v == mine then
    gone[#gone + 1] = free[i]
  end
  codes[i] = (v == 'd') and '1' or '0'
end
local ttl = span * {SPANS_KEPT + 1}
local placed, others = set_done(prefix, cur, split(ARGV[3]), ttl)
-- A freed record is forgotten (no field is the same as 'f' to CLAIM), in every span kept:
-- a failure leaves nothing behind in Redis, however many attempts a record takes. So is
-- the claim of a success held by its bit.
for _, ref in ipairs(placed) do
  gone[#gone + 1] = ref
end
if #gone > 0 then
  for b = cur, cur - {SPANS_KEPT - 1}, -1 do
    local key = prefix .. b
    if redis.call('EXISTS', key) == 1 then
      for s = 1, #gone, 1000 do
        redis.call('HDEL', key, unpack(gone, s, math.min(s + 999, #gone)))
      end
      drop_if_bare(key)
    end
  end
end
local pairs = {{}}
for _, ref in ipairs(others) do
  pairs[#pairs + 1] = ref
  pairs[#pairs + 1] = 'd'
end
write(prefix .. cur, pairs, ttl)
return table.concat(codes)
"""


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

    def __init__(self, client: Redis, names: Names, done_ttl_s: float = DEFAULT_DONE_TTL_S,
                 holder_ttl_s: float = DEFAULT_HOLDER_TTL_S) -> None:
        self._client = client
        self._names = names
        self._claim = client.register_script(CLAIM)
        self._finish = client.register_script(FINISH)
        self.holder = uuid.uuid4().hex[:12]
        self._span_ms = max(1, int(done_ttl_s * 1000 / (SPANS_KEPT - 1)))
        self._holder_ms = int(holder_ttl_s * 1000)
        self._holders = names.redis_key("once-holder", "")
        self._running: dict[str, set[str]] = {}  # per binding: refs claimed, not finished
        self._heartbeat: asyncio.Task[None] | None = None
        # chunks ended and not yet written: per binding, the done and the free refs
        self._pending: dict[str, tuple[list[str], list[str]]] = {}
        # per binding, the finish() calls waiting for the next write to land
        self._waiters: dict[str, list[asyncio.Future[set[str]]]] = {}
        self._writer: asyncio.Task[None] | None = None

    def prefix(self, binding: str) -> str:
        """The prefix of ``binding``'s hashes (the span number follows)."""
        return self._names.redis_key("once", binding, "")

    async def claim(self, binding: str, items: Sequence[Item]) -> str:
        """One code per item (see :data:`RUN` and the others)."""
        if not items:
            return ""
        refs = [item["source_ref"] for item in items]
        codes = await self._claim(args=[
            self.holder, self._holders, self._holder_ms, self._span_ms,
            self.prefix(binding), join_refs(refs)])
        text = as_text(codes)
        running = self._running.setdefault(binding, set())
        if text.count(RUN) == len(text):
            running.update(refs)
        else:
            out = []
            for ref, code in zip(refs, text, strict=True):
                if code == MINE:  # running here: wait for it; else a claim left behind
                    code = BUSY if ref in running else RUN
                if code in (RUN, TAKEN_OVER):
                    running.add(ref)
                out.append(code)
            text = "".join(out)
        self._ensure_heartbeat()
        return text

    def forget(self, binding: str, items: Sequence[Item]) -> None:
        """``items`` no longer run here (their claims, if still in Redis, are stale)."""
        running = self._running.get(binding)
        if running:
            running.difference_update(i["source_ref"] for i in items)

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
        done, free = self._pending.setdefault(binding, ([], []))
        for item in items:
            (done if item["id"] in ok else free).append(item["source_ref"])
        waiter: asyncio.Future[set[str]] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(binding, []).append(waiter)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="asynctier-once-writer")
        try:
            elsewhere = await waiter
        finally:
            # Only now: until the write lands, a copy read again meanwhile finds this
            # scheduler's claim and must wait for it (not run beside a success unwritten).
            self.forget(binding, items)
        if not elsewhere:
            return set()
        return {item["id"] for item in items
                if item["id"] not in ok and item["source_ref"] in elsewhere}

    async def _write(self) -> None:
        """Write the pending chunks, binding by binding, until none is left; each binding's
        waiters learn how its own write went (one binding's broken keys fail only its
        chunks; Redis out of reach fails every binding still to write)."""
        while self._pending:
            pending, self._pending = self._pending, {}
            waiters, self._waiters = self._waiters, {}
            down: Exception | None = None
            for binding, (done, free) in pending.items():
                mine = waiters.pop(binding, [])
                if down is not None:
                    _settle(mine, exception=down)
                    continue
                try:
                    codes = await self._finish(args=[self._span_ms, self.prefix(binding),
                                                     join_refs(done) if done else "",
                                                     join_refs(free) if free else "",
                                                     self.holder])
                    text = as_text(codes)
                    elsewhere = ({ref for ref, code in zip(free, text, strict=True)
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

    async def close(self) -> None:
        """Stop the heartbeat and drop the holder key: claims left here are free at once."""
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
        with contextlib.suppress(*REDIS_DOWN):
            await self._client.delete(self._holders + self.holder)

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat(), name="asynctier-once-heartbeat")

    async def _beat(self) -> None:
        while any(self._running.values()):
            await asyncio.sleep(self._holder_ms / 3000)
            try:
                await self._client.set(self._holders + self.holder, "1", px=self._holder_ms)
            except REDIS_DOWN as exc:
                log.debug("could not renew the run-once holder key: %s", exc)
