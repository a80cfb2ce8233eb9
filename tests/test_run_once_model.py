"""The run-once scripts against the real Redis, checked against a model of what they mean.

Random sequences of claims and finishes by two live schedulers, over references that
share bitmaps, sit on block edges (offsets 8,191 and 8,192), or cannot be a bit at all
(no offset, a leading zero, an offset too long for Lua), must give the codes and the
states the model gives: a success is done for good, a claim holds a record for its
scheduler until that one frees it, a failure frees only its own scheduler's claim, and a
record is claimed once per batch. Storage (a bit or a hash field) must not show.
"""

from __future__ import annotations

import uuid

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynctier.platform.limits import once
from asynctier.platform.limits.quota import join_refs

REFS = ["t/0/0", "t/0/1", "t/0/8191", "t/0/8192", "t/1/8191", "t/1/16384",
        "t/0/07", "t/0/12345678901234567", "job-42", "other/3/5"]
HOLDERS = ["aaaa", "bbbb"]
SPAN_MS = 3_600_000  # one span for the whole example

Op = tuple[str, int, list[int], list[bool]]

OPS = st.lists(st.tuples(st.sampled_from(["claim", "finish"]), st.integers(0, 1),
                         st.lists(st.integers(0, len(REFS) - 1), min_size=1, max_size=6),
                         st.lists(st.booleans(), min_size=6, max_size=6)),
               min_size=1, max_size=25)


class Model:
    """What the scripts mean: per reference, absent (free), ``d`` or ``r<holder>``."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}

    def claim(self, holder: str, refs: list[str]) -> str:
        codes, seen = [], set()
        for ref in refs:
            v = self.state.get(ref)
            if ref in seen:
                code = "2"
            elif v is None:
                code = "0"
            elif v == "d":
                code = "1"
            elif v == "r" + holder:
                code = once.MINE
            else:
                code = "2"  # both schedulers are alive
            seen.add(ref)
            codes.append(code)
        for ref, code in zip(refs, codes, strict=True):
            if code == "0":
                self.state[ref] = "r" + holder
        return "".join(codes)

    def finish(self, holder: str, done: list[str], free: list[str]) -> str:
        codes = ["1" if self.state.get(ref) == "d" else "0" for ref in free]
        for ref in free:
            if self.state.get(ref) == "r" + holder:
                del self.state[ref]
        for ref in done:
            self.state[ref] = "d"
        return "".join(codes)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # keys per example
@given(ops=OPS)
def test_the_scripts_do_what_the_model_says(redis_client: redis.Redis, prefix: str,
                                            ops: list[Op]) -> None:
    claim = redis_client.register_script(once.CLAIM)
    finish = redis_client.register_script(once.FINISH)
    tag = f"{prefix}:{{once:m{uuid.uuid4().hex[:8]}}}:"
    holders, keys = tag + "holder:", tag
    for holder in HOLDERS:
        redis_client.set(holders + holder, "1", px=600_000)
    model = Model()
    for kind, who, picks, oks in ops:
        holder = HOLDERS[who]
        refs = [REFS[i] for i in picks]
        if kind == "claim":
            got = claim(keys=[holders + holder],
                        args=[holder, holders, 600_000, SPAN_MS, keys, join_refs(refs)])
            assert got.decode() == model.claim(holder, refs), (kind, holder, refs)
        else:
            unique = list(dict.fromkeys(refs))
            done = [ref for ref, ok in zip(unique, oks, strict=False) if ok]
            free = [ref for ref in unique if ref not in done]
            got = finish(keys=[holders + holder],
                         args=[SPAN_MS, keys, join_refs(done) if done else "",
                               join_refs(free) if free else "", holder])
            assert got.decode() == model.finish(holder, done, free), (kind, holder, done, free)
    # every reference, looked at by a third scheduler, is where the model has it
    final = claim(keys=[holders + "zzzz"],
                  args=["zzzz", holders, 600_000, SPAN_MS, keys, join_refs(REFS)]).decode()
    want = "".join("1" if model.state.get(r) == "d" else "2" if r in model.state else "0"
                   for r in REFS)
    assert final == want
    # no claim outlives its record: hash fields are the claims running and the successes a
    # bit cannot hold
    fields = {}
    for key in redis_client.scan_iter(match=f"{keys}*"):
        if redis_client.type(key) == b"hash":
            fields.update({k.decode(): v.decode() for k, v in redis_client.hgetall(key).items()
                           if k.decode() != once.HT_FIELD})
    for ref, value in fields.items():
        if value == "d":
            assert ref in ("t/0/07", "t/0/12345678901234567", "job-42"), ref
        else:
            assert value == "rzzzz" or model.state.get(ref) == value, (ref, value)
