"""The run-once scripts against the real Redis, checked against a model of what they mean.

Random sequences of claims, fresh runs (running ranges written, docs/design.md "Run once
off the path"), finishes and deaths (a holder that lapsed) by two schedulers, over
references that share bitmaps, sit on block edges (offsets 8,191 and 8,192), or cannot be
a bit at all (no offset, a leading zero, an offset too long for Lua), must give the codes
and the states the model gives: a success is done for good, a claim or a live holder's
range holds a record for its scheduler until that one frees it, a dead holder's records
are taken over (its ranges removed), a failure frees only its own scheduler's claim, a
range goes with the write-down of its last record, and a record is claimed once per
batch. Storage (a bit or a hash field) must not show.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from asynctier.platform.scripts import lua
from asynctier.scheduler.limits import once
from asynctier.scheduler.limits.quota import join_refs

REFS = ["t/0/0", "t/0/1", "t/0/8191", "t/0/8192", "t/1/8191", "t/1/16384",
        "t/0/07", "t/0/12345678901234567", "job-42", "other/3/5"]
HOLDERS = ["aaaa", "bbbb"]
SPAN_MS = 3_600_000  # one span for the whole example
HOLDER_MS = 600_000

Op = tuple[str, int, list[int], list[bool]]

OPS = st.lists(st.tuples(st.sampled_from(["claim", "finish", "fresh", "die"]),
                         st.integers(0, 1),
                         st.lists(st.integers(0, len(REFS) - 1), min_size=1, max_size=6),
                         st.lists(st.booleans(), min_size=6, max_size=6)),
               min_size=1, max_size=25)


def kafka(ref: str) -> tuple[str, int] | None:
    """A Kafka reference's partition and offset (once_lib.lua's rule), or None."""
    block = once.each_block(ref)[0]
    return None if block is None else (block[0], int(ref.rpartition("/")[2]))


class Model:
    """What the scripts mean: per reference, absent (free), ``d`` or ``r<holder>``; the
    running ranges in Redis (partition -> {member: (lo, hi, holder)}); which holders are
    alive; and, per holder, the records of each of its ranges not finished yet (what
    RunOnce keeps to know when a range ended)."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.ranges: dict[str, dict[str, tuple[int, int, str]]] = {}
        self.alive = set(HOLDERS)
        self.left: dict[str, dict[tuple[str, str], set[str]]] = {h: {} for h in HOLDERS}

    def covering(self, ref: str) -> tuple[int, int, str] | None:
        found = kafka(ref)
        if found is None:
            return None
        tp, off = found
        for _, member in sorted((r[0], m) for m, r in self.ranges.get(tp, {}).items()):
            lo, hi, holder = self.ranges[tp][member]
            if lo <= off <= hi:
                return lo, hi, holder
        return None

    def claim(self, holder: str, refs: list[str]) -> str:
        self.alive.add(holder)
        codes, seen, read, dead = [], set(), set(), set()
        for ref in refs:
            v = self.state.get(ref)
            if ref in seen:
                code = "2"
            elif v is None:
                code = "0"
                if (found := kafka(ref)) is not None:
                    read.add(found[0])
                    r = self.covering(ref)
                    if r is not None:
                        code = self._of(holder, r[2], dead)
            elif v == "d":
                code = "1"
            elif v == "r" + holder:
                code = once.MINE
            else:
                code = self._of(holder, v[1:], dead)
            seen.add(ref)
            codes.append(code)
        for ref, code in zip(refs, codes, strict=True):
            if code in ("0", "3"):
                self.state[ref] = "r" + holder
        for tp in read:  # the dead holders' ranges the script looked at are removed
            members = self.ranges.get(tp, {})
            for member in [m for m, r in members.items() if r[2] in dead]:
                del members[member]
        return "".join(codes)

    def _of(self, me: str, other: str, dead: set[str]) -> str:
        if other == me:
            return once.MINE
        if other in self.alive:
            return "2"
        dead.add(other)
        return "3"

    def fresh(self, holder: str, refs: list[str]) -> dict[str, str]:
        """The ranges a scheduler writes for ``refs`` sent fresh."""
        self.alive.add(holder)
        offsets: dict[str, list[int]] = {}
        for ref in refs:
            tp, off = kafka(ref)  # type: ignore[misc]
            offsets.setdefault(tp, []).append(off)
        ranges = {tp: f"{min(o)}:{max(o)}:{holder}" for tp, o in offsets.items()}
        for tp, member in ranges.items():
            lo, hi, _ = member.split(":", 2)
            self.ranges.setdefault(tp, {})[member] = (int(lo), int(hi), holder)
            self.left[holder][(tp, member)] = {r for r in refs if kafka(r)[0] == tp}  # type: ignore[index]
        return ranges

    def finish(self, holder: str, done: list[str], free: list[str]) -> tuple[str, list[str]]:
        """The codes, and the ranges of ``holder`` whose records all ended."""
        codes = ["1" if self.state.get(ref) == "d" else "0" for ref in free]
        for ref in free:
            if self.state.get(ref) == "r" + holder:
                del self.state[ref]
        for ref in done:
            self.state[ref] = "d"
        ended = []
        for (tp, member), refs in list(self.left[holder].items()):
            refs -= set(done) | set(free)
            if not refs:
                del self.left[holder][(tp, member)]
                self.ranges.get(tp, {}).pop(member, None)
                ended.append(f"{tp}\t{member}")
        return "".join(codes), ended


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # keys per example
@given(ops=OPS)
@example(ops=[  # a record done by a copy that ran unguarded fails in a live fresh range
    ("claim", 0, [0], [False] * 6), ("finish", 0, [0], [False] * 6),
    ("fresh", 1, [0], [False] * 6), ("finish", 0, [1, 0], [False, True] + [False] * 4),
    ("finish", 1, [0], [False] * 6)])
def test_the_scripts_do_what_the_model_says(redis_client: redis.Redis, prefix: str,
                                            ops: list[Op]) -> None:
    claim_script = redis_client.register_script(once.CLAIM)
    finish_script = redis_client.register_script(once.FINISH)
    range_script = redis_client.register_script(once.RANGE)
    tag = f"{prefix}:{{once:m{uuid.uuid4().hex[:8]}}}:"
    holders, keys = tag + "holders", tag
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    span = now_ms // SPAN_MS
    redis_client.zadd(holders, {h: now_ms + HOLDER_MS for h in HOLDERS})

    def claim(holder: str, refs: list[str]) -> str:
        got = claim_script(keys=once.run_once_keys(holders, keys, span, join_refs(refs)),
                           args=[holder, HOLDER_MS, SPAN_MS, keys, join_refs(refs)])
        return str(got.decode())

    def finish(holder: str, done: list[str], free: list[str], ended: list[str],
               own: set[str]) -> str:
        # its own fresh records go as RunOnce sends them: successes and failures as runs of
        # offsets; free must list those failures last, by partition and offset
        runs: dict[str, list[int]] = {}
        for ref in done:
            if ref in own:
                tp, off = kafka(ref)  # type: ignore[misc]
                runs.setdefault(tp, []).append(off)
        failed: dict[str, list[int]] = {}
        for ref in free:
            if ref in own:
                tp, off = kafka(ref)  # type: ignore[misc]
                failed.setdefault(tp, []).append(off)
        done = [ref for ref in done if ref not in own]
        free = [ref for ref in free if ref not in own]
        texts = [join_refs(done) if done else "", join_refs(free) if free else ""]
        got = finish_script(
            keys=once.run_once_keys(holders, keys, span, *texts, *own),
            args=[SPAN_MS, keys, *texts, holder, "\n".join(ended), once.runs_of(runs),
                  once.runs_of(failed)])
        return str(got.decode())

    def fresh(holder: str, ranges: dict[str, str]) -> None:
        lines = "\n".join(f"{tp}\t{member}" for tp, member in ranges.items())
        got = range_script(keys=[holders, *(f"{keys}running:{tp}" for tp in ranges)],
                           args=[holder, HOLDER_MS, SPAN_MS * 5, keys, lines])
        assert got == b"1"

    model = Model()
    for kind, who, picks, oks in ops:
        holder = HOLDERS[who]
        refs = [REFS[i] for i in picks]
        if kind == "claim":
            assert claim(holder, refs) == model.claim(holder, refs), (kind, holder, refs)
        elif kind == "fresh":  # records nobody sent: Kafka offsets, free, in no range
            refs = [r for r in dict.fromkeys(refs) if kafka(r) is not None
                    and r not in model.state and model.covering(r) is None]
            if refs:
                fresh(holder, model.fresh(holder, refs))
        elif kind == "die":  # judged dead: its holder lapsed
            redis_client.zrem(holders, holder)
            model.alive.discard(holder)
        else:
            unique = list(dict.fromkeys(refs))
            done = [ref for ref, ok in zip(unique, oks, strict=False) if ok]
            free = [ref for ref in unique if ref not in done]
            own = set().union(*model.left[holder].values())  # before the model ends them
            parts = list(dict.fromkeys(kafka(r)[0] for r in free if r in own))  # type: ignore[index]
            free = [r for r in free if r not in own] + [
                r for tp in parts for r in sorted(
                    (r for r in free if r in own and kafka(r)[0] == tp),
                    key=lambda r: kafka(r)[1])]  # type: ignore[index]
            codes, ended = model.finish(holder, done, free)
            assert finish(holder, done, free, ended, own) == codes, (kind, holder, done, free)
    # every reference, looked at by a third scheduler, is where the model has it
    final = claim("zzzz", REFS)
    assert final == model.claim("zzzz", REFS)
    # no claim outlives its record: hash fields are the claims running and the successes a
    # bit cannot hold; the ranges in Redis are the model's
    fields = {}
    members = {}
    for key in redis_client.scan_iter(match=f"{keys}*"):
        if redis_client.type(key) == b"hash":
            fields.update({k.decode(): v.decode() for k, v in redis_client.hgetall(key).items()
                           if k.decode() != once.HT_FIELD})
        elif redis_client.type(key) == b"zset" and key.decode() != holders:
            tp = key.decode().removeprefix(f"{keys}running:")
            members[tp] = {m.decode() for m in redis_client.zrange(key, 0, -1)}
    for ref, value in fields.items():
        if value == "d":
            assert ref in ("t/0/07", "t/0/12345678901234567", "job-42"), ref
        else:
            assert value == "rzzzz" or model.state.get(ref) == value, (ref, value)
    assert members == {tp: set(m) for tp, m in model.ranges.items() if m}


# -- every key in KEYS: the names Python gives are the names the scripts use -----------

#: The bitmaps (``<topic/partition>:<block>``) by_block of once_lib.lua finds in a batch.
BY_BLOCK = lua("once_lib", SPANS_KEPT=once.SPANS_KEPT, BLOCK=once.BLOCK, HT_PAD=once.HT_PAD) + """
local order = by_block(split(ARGV[1]))
local out = {}
for _, group in ipairs(order) do out[#out + 1] = group[1] end
return out
"""

OFFSETS = st.one_of(st.integers(0, 10**16).map(str), st.text("0123456789", max_size=18),
                    st.sampled_from(["07", "00", "0", "\u0663", "\u00b2", "1\u0663", "", "x1"]))
REFERENCES = st.one_of(
    st.tuples(st.text("ab/%\n\u00e9:", max_size=6), st.integers(0, 3), OFFSETS)
    .map(lambda t: f"{t[0]}/{t[1]}/{t[2]}"),
    st.text("t/0123456789%\n\u0663", max_size=12))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(refs=st.lists(REFERENCES, min_size=1, max_size=8))
def test_python_and_lua_find_the_same_bitmaps(redis_client: redis.Redis,
                                              refs: list[str]) -> None:
    by_block = redis_client.register_script(BY_BLOCK)
    lua_found = {g.decode() for g in by_block(keys=[], args=[join_refs(refs)])}
    python_found = {f"{where}:{block}" for where, block in once.blocks_of(join_refs(refs))}
    assert python_found == lua_found


def _span_now(redis_client: redis.Redis) -> int:
    seconds, micros = redis_client.time()
    return int((seconds * 1000 + micros // 1000) // SPAN_MS)


def test_a_script_refuses_a_key_it_was_not_given(redis_client: redis.Redis,
                                                 prefix: str) -> None:
    claim = redis_client.register_script(once.CLAIM)
    tag = f"{prefix}:{{once:refuse}}:"
    refs = ["t/0/1", "t/0/9000"]  # two bitmaps
    keys = once.run_once_keys(tag + "holders", tag, _span_now(redis_client), join_refs(refs))
    with pytest.raises(redis.ResponseError, match="is not in KEYS"):  # a bitmap left out
        claim(keys=[k for k in keys if not k.endswith(":t/0:1")],
              args=["aaaa", 600_000, SPAN_MS, tag, join_refs(refs)])
    assert claim(keys=keys, args=["aaaa", 600_000, SPAN_MS, tag, join_refs(refs)]) == b"00"


def test_a_span_not_given_is_answered_with_redis_span_and_nothing_is_written(
        redis_client: redis.Redis, prefix: str) -> None:
    claim = redis_client.register_script(once.CLAIM)
    finish = redis_client.register_script(once.FINISH)
    tag = f"{prefix}:{{once:skew}}:"
    span = _span_now(redis_client)
    for off in (span + 2, span - 3):  # the scheduler's clock over a span ahead, or behind
        keys = once.run_once_keys(tag + "holders", tag, off, "t/0/1")
        got = claim(keys=keys, args=["aaaa", 600_000, SPAN_MS, tag, "t/0/1"]).decode()
        assert got in (f"{once.SKEW}{span}", f"{once.SKEW}{span + 1}")  # span may turn
        got = finish(keys=keys, args=[SPAN_MS, tag, "t/0/1", "", "aaaa"]).decode()
        assert got.startswith(once.SKEW)
    assert not list(redis_client.scan_iter(match=tag + "*"))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offsets=st.lists(st.one_of(st.integers(0, 40), st.integers(8180, 8200),
                                  st.integers(0, 30_000)), min_size=1, max_size=60))
def test_successes_as_runs_set_the_bits_their_references_set(
        redis_client: redis.Redis, prefix: str, offsets: list[int]) -> None:
    """A fresh chunk's successes go to once_finish.lua as runs of offsets: they must set
    exactly the bits the same successes set as references, across bytes and blocks."""
    finish = redis_client.register_script(once.FINISH)
    span = _span_now(redis_client)
    bitmaps = []
    for way in ("refs", "runs"):
        tag = f"{prefix}:{{once:{way}{uuid.uuid4().hex[:6]}}}:"
        refs = [f"t/0/{off}" for off in dict.fromkeys(offsets)]
        done, runs = (join_refs(refs), "") if way == "refs" else ("", once.runs_of(
            {"t/0": list(dict.fromkeys(offsets))}))
        keys = once.run_once_keys(tag + "holders", tag, span, join_refs(refs))
        assert finish(keys=keys, args=[SPAN_MS, tag, done, "", "aaaa", "", runs]) == b""
        bitmaps.append({block: redis_client.get(f"{tag}{span}:t/0:{block}")
                        for block in range(4)})
    assert bitmaps[0] == bitmaps[1]
