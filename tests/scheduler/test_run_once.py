"""The run-once guard against the real Redis: a record that succeeded is not run again when
it is read again, a copy running elsewhere is waited for, a dead scheduler's claims are
taken over, and an ``idempotent`` binding skips all of it.

Two :class:`RedisAdmission` instances (each with its own client, and its guard with its own
holder id) stand for two schedulers; they share only what Redis holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import redis
import redis.asyncio as redis_asyncio

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.platform.wire import Item, Outcome, ok, retry
from asynctier.scheduler.guard import BUSY, DONE, RUN, TAKEN_OVER
from asynctier.scheduler.limits import AdmissionConfig, RedisAdmission, RedisGuard, once
from asynctier.scheduler.limits.once import RunOnce
from asynctier.scheduler.options import SchedulerOptions
from tests.funcs import basic
from tests.scheduler_harness import by_id, local_scheduler

GUARDED = Binding("orders", Source("kafka", "orders"), "tests.funcs.basic:slow_record",
                  execution=Execution(timeout_s=5.0))


def make_items(refs: list[str], payload: dict[str, object] | None = None,
               binding: str = "orders") -> list[Item]:
    body = json.dumps(payload or {}).encode()
    return [{"id": n, "binding": binding, "payload": body, "key": None, "headers": [],
             "attempt": 1, "source_ref": ref, "record_time_ms": 0,
             "priority": 0, "deadline_ms": None}
            for n, ref in enumerate(refs)]


def runs_by_ref() -> Counter[str]:
    return Counter(ctx.source for _, ctx in basic.SEEN)


def test_the_window_comes_from_the_config_file() -> None:
    assert Settings.from_mapping({}).run_once_window_s == 900.0
    assert Settings.from_mapping({"asynctier": {"run_once_window": "1h"}}).run_once_window_s \
        == 3600.0
    for bad, says in (("30s", "too short"), ("soon", "is not a duration")):
        with pytest.raises(ConfigError, match=says):
            Settings.from_mapping({"asynctier": {"run_once_window": bad}})


def test_claim_codes_follow_a_record_from_claim_to_done(settings: Settings,
                                                        redis_client: redis.Redis) -> None:
    refs = ["orders/0/1", "orders/0/2", "orders/0/3"]
    batch = make_items(refs)

    async def scenario() -> list[str]:
        a, b = RedisAdmission(settings), RedisAdmission(settings)
        try:
            seen = [await a.guard.claim(GUARDED, batch), await b.guard.claim(GUARDED, batch)]
            outcomes: list[Outcome] = [ok(0), retry(1, "boom")]
            await a.guard.finish(GUARDED, batch[:2], outcomes)  # the third still runs in a
            seen.append(await b.guard.claim(GUARDED, batch))
            # a dies: its holder is dropped (as when it stops beating for 5 s)
            redis_client.zrem(a.guard.once.holders("orders"), a.guard.once.holder)
            seen.append(await b.guard.claim(GUARDED, batch[2:]))
            seen.append(await a.guard.claim(GUARDED, batch))
            return seen
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(scenario()) == [
        RUN * 3,  # a claims all three
        BUSY * 3,  # b finds them running in a, which is alive
        DONE + RUN + BUSY,  # 1 succeeded; 2 failed and was released: b claims it; 3 in a
        TAKEN_OVER,  # a is dead: b takes 3 over
        DONE + BUSY + BUSY,  # b holds 2 and 3 now
    ]
    kept = list(redis_client.scan_iter(match=f"{settings.prefix}:{{once:orders}}:[0-9]*"))
    assert kept and all(redis_client.ttl(k) > 900 for k in kept)  # done marks: 15 min +


def test_a_scheduler_whose_clock_is_spans_off_learns_redis_span(settings: Settings) -> None:
    """The keys a call names come from the scheduler's clock; Redis' clock decides. A
    clock three spans ahead gets the span-skew answer once, asks again with Redis' span
    and keeps it: the guard works as with a right clock."""
    batch = make_items(["orders/6/1", "orders/6/2"])

    async def scenario() -> tuple[list[str], int, int]:
        a, b = RedisAdmission(settings), RedisAdmission(settings)
        span_s = a.guard.once._span_ms / 1000
        a.guard.once._clock = lambda: time.time() + 3 * span_s
        try:
            seen = [await a.guard.claim(GUARDED, batch)]
            skew = a.guard.once._skew
            await a.guard.finish(GUARDED, batch, [ok(0), retry(1, "boom")])
            seen.append(await b.guard.claim(GUARDED, batch))
            return seen, skew, a.guard.once._skew
        finally:
            await a.close()
            await b.close()

    seen, skew, later = asyncio.run(scenario())
    assert seen == [RUN * 2, DONE + RUN]
    assert skew in (-3, -4, -2) and later == skew


def test_two_copies_in_one_batch_are_one_record(settings: Settings) -> None:
    batch = make_items(["orders/9/1", "orders/9/2", "orders/9/1"])

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            first = await admission.guard.claim(GUARDED, batch)
            await admission.guard.finish(GUARDED, batch[:2], [ok(0), ok(1)])
            return [first, await admission.guard.claim(GUARDED, batch[2:])]
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [RUN + RUN + BUSY, DONE]


def test_a_claim_this_scheduler_could_not_free_is_taken_back(settings: Settings) -> None:
    """Redis was down when a chunk ended: its claims stay in Redis. The record's copy that
    comes back must run (not wait for a run that is over), while a copy of a record still
    running here waits."""
    batch = make_items(["orders/8/1", "orders/8/2"])

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            first = await admission.guard.claim(GUARDED, batch)
            admission.guard.once.forget(GUARDED.name, batch[:1])  # ended; its finish was lost
            return [first, await admission.guard.claim(GUARDED, batch)]
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [RUN + RUN, RUN + BUSY]


def test_chunks_ending_together_are_written_in_few_round_trips(settings: Settings) -> None:
    """Twenty chunks end at once: they are written together, in one round trip, and each
    returns only once its marks are in Redis."""
    chunks = [make_items([f"orders/7/{c * 10 + n}" for n in range(10)]) for c in range(20)]

    async def scenario() -> tuple[int, str]:
        admission = RedisAdmission(settings)
        once = admission.guard.once
        calls = 0
        write = once._finish

        async def counted(**kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return await write(**kwargs)

        once._finish = counted  # type: ignore[assignment]
        try:
            every = [i for c in chunks for i in c]
            await admission.guard.claim(GUARDED, every)
            await asyncio.gather(*(admission.guard.finish(GUARDED, c, [ok(i["id"]) for i in c])
                                   for c in chunks))
            return calls, await admission.guard.claim(GUARDED, every)
        finally:
            await admission.close()

    calls, codes = asyncio.run(scenario())
    assert codes == DONE * 200
    assert calls == 1, f"{calls} round trips for 20 chunks"


def test_a_done_mark_lasts_its_ttl_and_then_the_record_may_run_again(
        settings: Settings) -> None:
    """Remembered for done_ttl_s to 4/3 of it (whole spans of a third), then claimed to run."""
    batch = make_items(["orders/1/7"])

    async def scenario() -> tuple[list[str], float]:
        admission = RedisAdmission(settings, AdmissionConfig(done_ttl_s=1.0))
        try:
            await admission.guard.claim(GUARDED, batch)
            await admission.guard.finish(GUARDED, batch, [ok(0)])
            written = time.monotonic()
            seen = [await admission.guard.claim(GUARDED, batch)]
            code = seen[0]
            while code == DONE:
                assert time.monotonic() - written < 5, "the done mark outlived its ttl"
                await asyncio.sleep(0.05)
                code = await admission.guard.claim(GUARDED, batch)
            seen.append(code)  # the code that ended the wait, whatever it is
            return seen, time.monotonic() - written
        finally:
            await admission.close()

    seen, lasted = asyncio.run(scenario())
    assert seen == [DONE, RUN]
    assert lasted >= 0.9, f"the done mark lasted {lasted:.2f}s of a 1s ttl"


def test_an_idempotent_binding_is_never_claimed(settings: Settings,
                                                redis_client: redis.Redis) -> None:
    free = GUARDED.with_changes(execution=replace(GUARDED.execution, idempotent=True))
    batch = make_items(["orders/2/1", "orders/2/2"])

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            first = await admission.guard.claim(free, batch)
            await admission.guard.finish(free, batch, [ok(0), ok(1)])
            return [first, await admission.guard.claim(free, batch)]
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [RUN * 2, RUN * 2]
    assert not list(redis_client.scan_iter(match=f"{settings.prefix}:{{once:*"))


def test_without_redis_a_fail_open_binding_runs_everything(settings: Settings) -> None:
    dead = settings.with_overrides(redis_url="redis://127.0.0.1:1/0")
    batch = make_items(["orders/3/1", "orders/3/2"])

    async def scenario() -> str:
        admission = RedisAdmission(dead, AdmissionConfig(socket_timeout_s=0.2))
        try:
            codes = await admission.guard.claim(GUARDED, batch)
            await admission.guard.finish(GUARDED, batch, [ok(0), ok(1)])  # must not raise
            return codes
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == RUN * 2


def test_a_batch_read_again_runs_only_what_did_not_succeed(settings: Settings) -> None:
    basic.reset()
    refs = [f"orders/4/{n}" for n in range(40)]

    async def scenario() -> tuple[dict[int, Outcome], dict[int, Outcome]]:
        admission = RedisAdmission(settings)
        scheduler = local_scheduler([GUARDED], admission=admission, guard=admission.guard)
        scheduler.start()
        try:
            failing = make_items(refs)
            for i in failing[30:]:  # the last ten fail the first time
                i["payload"] = b'{"fail": true}'
            first = by_id(await scheduler.process(failing))
            again = by_id(await scheduler.process(make_items(refs)))  # read again
            return first, again
        finally:
            await scheduler.stop()
            await admission.close()

    first, again = asyncio.run(scenario())
    assert [first[n]["status"] for n in range(40)] == ["ok"] * 30 + ["retry"] * 10
    assert all(o["status"] == "ok" for o in again.values()) and len(again) == 40
    runs = runs_by_ref()
    assert {runs[r] for r in refs[:30]} == {1}, "a record that succeeded ran again"
    assert {runs[r] for r in refs[30:]} == {2}, "a failed record must run again"


async def _once_free(other: RedisAdmission, refs: list[str], deadline: float) -> str:
    """``other``'s claim codes of ``refs``, claimed again until all are RUN (freed)."""
    while (codes := await other.guard.claim(GUARDED, make_items(refs))) != RUN * len(refs):
        assert time.monotonic() < deadline, f"still claimed: {codes}"
        await asyncio.sleep(0.05)
    return codes


def test_records_claimed_by_a_caller_that_went_away_before_they_queued_are_freed(
        settings: Settings) -> None:
    """The tailer's call is cancelled while its batch waits for admission: the records it
    claimed are freed at once, so the copy sent again runs instead of waiting for a run
    that will never happen."""
    refs = [f"orders/10/{n}" for n in range(5)]

    class Stuck(RedisAdmission):
        async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
            await asyncio.Event().wait()  # admission never answers
            return {}

    async def scenario() -> str:
        stuck, other = Stuck(settings), RedisAdmission(settings)
        scheduler = local_scheduler([GUARDED], admission=stuck, guard=stuck.guard)
        scheduler.start()
        try:
            call = asyncio.create_task(scheduler.process(make_items(refs)))
            deadline = time.monotonic() + 10
            while not await stuck._client.keys(f"{settings.prefix}:{{once:orders}}:*"):
                assert time.monotonic() < deadline, "the batch was never claimed"
                await asyncio.sleep(0.02)
            call.cancel()
            return await _once_free(other, refs, deadline)
        finally:
            await scheduler.stop()
            await stuck.close()
            await other.close()

    assert asyncio.run(scenario()) == RUN * 5


def test_records_claimed_by_a_caller_that_went_away_during_the_claim_are_freed(
        settings: Settings) -> None:
    """The call is cancelled after the claim landed in Redis but before its answer was
    read (CI hit this on a slow machine in the test above): the claims are freed all the
    same, so the copy sent again runs instead of waiting for a run that never happens."""
    refs = [f"orders/11/{n}" for n in range(5)]
    landed = asyncio.Event()

    class Unanswered(RedisGuard):
        async def claim(self, binding: Binding, items: Sequence[Item]) -> str:
            codes = await super().claim(binding, items)  # in Redis now
            landed.set()
            await asyncio.Event().wait()  # the answer is never read
            return codes

    async def scenario() -> str:
        unanswered, other = RedisAdmission(settings), RedisAdmission(settings)
        unanswered.guard = Unanswered(unanswered.guard.link)
        scheduler = local_scheduler([GUARDED], admission=unanswered, guard=unanswered.guard)
        scheduler.start()
        try:
            call = asyncio.create_task(scheduler.process(make_items(refs)))
            await asyncio.wait_for(landed.wait(), 10)
            assert await other.guard.claim(GUARDED, make_items(refs)) == BUSY * 5  # the control
            call.cancel()
            return await _once_free(other, refs, time.monotonic() + 10)
        finally:
            await scheduler.stop()
            await unanswered.close()
            await other.close()

    assert asyncio.run(scenario()) == RUN * 5


def test_two_schedulers_given_the_same_batch_run_each_record_once(settings: Settings) -> None:
    """The copy read again after a tailer crash reaches another scheduler while the first
    is still running the batch: it waits, and is answered ok without running."""
    basic.reset()
    refs = [f"orders/5/{n}" for n in range(20)]

    async def scenario() -> list[dict[int, Outcome]]:
        made = [RedisAdmission(settings) for _ in range(2)]
        schedulers = [local_scheduler([GUARDED], admission=a, guard=a.guard) for a in made]
        for s in schedulers:
            s.start()
        try:
            return [by_id(o) for o in await asyncio.gather(
                *(s.process(make_items(refs, {"sleep": 0.02})) for s in schedulers))]
        finally:
            for s in schedulers:
                await s.stop()
            for a in made:
                await a.close()

    answers = asyncio.run(scenario())
    for outcomes in answers:
        assert [outcomes[n]["status"] for n in range(20)] == ["ok"] * 20
    assert runs_by_ref() == Counter({ref: 1 for ref in refs})


def test_a_dead_schedulers_claims_are_taken_over_within_the_holder_ttl(
        settings: Settings) -> None:
    """A scheduler that claimed a batch and died (its holder stops being renewed):
    the batch sent again to another scheduler waits at most the holder TTL (5 s), then
    runs."""
    basic.reset()
    refs = [f"orders/6/{n}" for n in range(10)]

    async def scenario() -> tuple[dict[int, Outcome], float]:
        dying, alive = RedisAdmission(settings), RedisAdmission(settings)
        await dying.guard.claim(GUARDED, make_items(refs))
        dying.guard.once._running.clear()  # its heartbeat stops, as a SIGKILL would stop it
        scheduler = local_scheduler([GUARDED], admission=alive, guard=alive.guard)
        scheduler.start()
        started = time.monotonic()
        try:
            outcomes = by_id(await scheduler.process(make_items(refs)))
            return outcomes, time.monotonic() - started
        finally:
            await scheduler.stop()
            await alive.close()
            await dying._client.aclose()

    outcomes, took = asyncio.run(scenario())
    assert [outcomes[n]["status"] for n in range(10)] == ["ok"] * 10
    assert runs_by_ref() == Counter({ref: 1 for ref in refs})
    assert took < 8, f"waited {took:.1f}s for a dead scheduler's claims"


def test_a_scheduler_judged_dead_frees_nothing_another_took_over(
        settings: Settings, redis_client: redis.Redis) -> None:
    """a is cut off long enough to be judged dead while it runs two records; b takes them
    over and finishes one. When a's runs fail, a must not free them: the one b finished
    stays done (a's failure is reported as done elsewhere) and the one b still runs stays
    b's (a third copy waits for it instead of running beside it)."""
    batch = make_items(["orders/4/1", "orders/4/2"])

    async def scenario() -> tuple[list[str], set[int], set[int]]:
        a, b, c = RedisAdmission(settings), RedisAdmission(settings), RedisAdmission(settings)
        try:
            seen = [await a.guard.claim(GUARDED, batch)]
            redis_client.zrem(a.guard.once.holders("orders"), a.guard.once.holder)
            seen.append(await b.guard.claim(GUARDED, batch))
            by_b = await b.guard.finish(GUARDED, batch[:1], [ok(0)])  # the second still runs in b
            by_a = await a.guard.finish(GUARDED, batch, [retry(0, "boom"), retry(1, "boom")])
            seen.append(await c.guard.claim(GUARDED, batch))
            return seen, by_b, by_a
        finally:
            for admission in (a, b, c):
                await admission.close()

    seen, by_b, by_a = asyncio.run(scenario())
    assert seen == [RUN * 2, TAKEN_OVER * 2, DONE + BUSY]
    assert by_b == set()
    assert by_a == {0}  # failed in a, done by b


def test_a_failure_after_another_scheduler_succeeded_with_the_record_is_answered_ok(
        settings: Settings, redis_client: redis.Redis) -> None:
    """The same through the scheduler: while its function runs, the scheduler is judged
    dead and another one takes the record over and succeeds; the function then fails
    here. The record is answered ok (a retry would run it a second time), the other record
    of the chunk, which nobody else had, is retried as usual."""
    binding = Binding("orders", Source("kafka", "orders"), "tests.funcs.basic:hooked_boom",
                      execution=Execution(timeout_s=5.0))
    items = make_items(["orders/3/1", "orders/3/2"])

    async def scenario() -> tuple[dict[int, Outcome], str]:
        a, b = RedisAdmission(settings), RedisAdmission(settings)

        async def taken_over_meanwhile(payload: object, ctx: object) -> None:
            if getattr(ctx, "source", None) != "orders/3/1":
                return
            # judged dead: its holder lapsed in Redis, its last renewal a holder's life ago
            redis_client.zrem(a.guard.once.holders("orders"), a.guard.once.holder)
            a.guard.once._monotonic = lambda: time.monotonic() + 60
            assert await b.guard.claim(binding, items[:1]) == TAKEN_OVER
            assert await b.guard.finish(binding, items[:1], [ok(0)]) == set()

        basic.HOOK = taken_over_meanwhile
        scheduler = local_scheduler([binding], admission=a, guard=a.guard)
        scheduler.start()
        try:
            outcomes = by_id(await scheduler.process(items))
            return outcomes, await b.guard.claim(binding, items)
        finally:
            basic.HOOK = None
            await scheduler.stop()
            await a.close()
            await b.close()

    outcomes, again = asyncio.run(scenario())
    assert outcomes[0]["status"] == "ok"
    assert outcomes[1]["status"] == "retry" and "failed after the hook" in outcomes[1]["error"]
    assert again == DONE + RUN  # a copy read later: the first is done, the second runs


def test_a_failure_leaves_nothing_in_redis(settings: Settings,
                                           redis_client: redis.Redis) -> None:
    """A success is remembered; a failure is forgotten (its field deleted), so a retry
    storm costs Redis no memory, and the retry's copy runs again."""
    batch = make_items(["orders/2/1", "orders/2/2", "orders/2/3"])
    keys = f"{settings.prefix}:{{once:orders}}:*"

    def fields() -> dict[bytes, list[bytes]]:
        return _hash_fields(redis_client, keys)

    async def scenario() -> tuple[list[str], dict[bytes, list[bytes]]]:
        admission = RedisAdmission(settings)
        try:
            first = await admission.guard.claim(GUARDED, batch[:2])
            claimed = fields()
            assert claimed[b"orders/2/2"] == [b"r" + admission.guard.once.holder.encode()]
            await admission.guard.finish(GUARDED, batch[:2], [ok(0), retry(1, "boom")])
            after = fields()
            return [first, await admission.guard.claim(GUARDED, batch)], after
        finally:
            await admission.close()

    seen, after = asyncio.run(scenario())
    assert b"orders/2/1" not in after  # its claim is gone: the success is a bit
    assert _done_bits(redis_client, f"{settings.prefix}:{{once:orders}}:") == {"orders/2/1"}
    assert b"orders/2/2" not in after
    assert seen == [RUN * 2, DONE + RUN + RUN]


def _hash_fields(client: redis.Redis, pattern: str) -> dict[bytes, list[bytes]]:
    """Every field of the run-once hashes (the claims, and successes kept as ``d``)."""
    found: dict[bytes, list[bytes]] = {}
    for key in client.scan_iter(match=pattern):
        if client.type(key) == b"hash":
            for ref, value in client.hgetall(key).items():
                if ref != once.HT_FIELD.encode():  # not a record: it keeps the hash a table
                    found.setdefault(ref, []).append(value)
    return found


def _done_bits(client: redis.Redis, prefix: str) -> set[str]:
    """The references whose success is a bit: ``<prefix><span>:<topic>/<partition>:<block>``
    holds offsets ``block * BLOCK`` on, the highest bit of the first byte first."""
    done: set[str] = set()
    for key in client.scan_iter(match=f"{prefix}[0-9]*:*"):
        where, block = key.decode()[len(prefix):].split(":", 1)[1].rsplit(":", 1)
        bits = client.get(key) or b""
        for i, byte in enumerate(bits):
            for j in range(8):
                if byte & (128 >> j):
                    done.add(f"{where}/{int(block) * once.BLOCK + i * 8 + j}")
    return done


def test_successes_cost_redis_a_bit_each(settings: Settings,
                                         redis_client: redis.Redis) -> None:
    """20,000 records of two partitions succeed: each is remembered as one bit of a bitmap
    per 8,192 offsets (before: a hash field of 80-100 bytes), no claim is left behind, and
    every one is answered done when read again."""
    refs = [f"orders/{p}/{100_000 + i}" for p in (0, 1) for i in range(10_000)]
    prefix = f"{settings.prefix}:{{once:orders}}:"

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            for start in range(0, len(refs), 1000):
                batch = make_items(refs[start:start + 1000])
                assert await admission.guard.claim(GUARDED, batch) == RUN * len(batch)
                await admission.guard.finish(GUARDED, batch, [ok(i) for i in range(len(batch))])
            return [await admission.guard.claim(GUARDED, make_items(refs[start:start + 1000]))
                    for start in range(0, len(refs), 1000)]
        finally:
            await admission.close()

    again = asyncio.run(scenario())
    assert again == [DONE * 1000] * 20
    assert _hash_fields(redis_client, f"{prefix}*") == {}
    assert _done_bits(redis_client, prefix) == set(refs)
    stored = sum(redis_client.strlen(k) for k in redis_client.scan_iter(match=f"{prefix}*:*"))
    assert stored <= 2 * (10_000 // 8 + 2 * 1024), stored  # a bit each, whole blocks at most


def test_claims_are_a_hash_table_and_a_hash_left_empty_is_deleted(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A batch of 300 claims (under the 512 fields up to which Redis keeps a hash as a flat
    list, searched from the start at every field read or written) is kept in a hash table;
    once the batch ends, the hash holding nothing but the field that makes it one is
    deleted."""
    prefix = f"{settings.prefix}:{{once:orders}}:"
    refs = [f"orders/{i % 4}/{5_000 + i // 4}" for i in range(300)]

    def hashes() -> list[bytes]:
        return [k for k in redis_client.scan_iter(match=f"{prefix}*")
                if redis_client.type(k) == b"hash"]

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        admission = RedisAdmission(settings)
        try:
            batch = make_items(refs)
            assert await admission.guard.claim(GUARDED, batch) == RUN * len(refs)
            encodings = [redis_client.object("encoding", key) for key in hashes()]
            await admission.guard.finish(GUARDED, batch, [ok(i) if i % 2 else retry(i, "boom")
                                                    for i in range(len(refs))])
            return encodings, hashes()
        finally:
            await admission.close()

    encodings, left = asyncio.run(scenario())
    assert encodings == [b"hashtable"]
    assert left == []


def test_references_a_bit_cannot_hold_are_remembered_whole(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A source reference that is not ``<topic>/<partition>/<offset>`` with an offset Lua
    holds exactly (no offset, a leading zero, 16 digits and more) keeps its success as a
    hash field: it is never taken for another record's bit."""
    prefix = f"{settings.prefix}:{{once:orders}}:"
    odd = ["job-42", "orders/0/07", "orders/0/9007199254740993", "orders/0/"]
    kafka = ["orders/0/7", "orders/0/9007199254740992"]

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            batch = make_items(odd)
            assert await admission.guard.claim(GUARDED, batch) == RUN * len(odd)
            await admission.guard.finish(GUARDED, batch, [ok(i) for i in range(len(odd))])
            return [await admission.guard.claim(GUARDED, make_items(odd)),
                    await admission.guard.claim(GUARDED, make_items(kafka))]
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [DONE * len(odd), RUN * len(kafka)]
    fields = _hash_fields(redis_client, f"{prefix}*")
    assert {ref.decode() for ref, values in fields.items() if values == [b"d"]} == set(odd)
    assert _done_bits(redis_client, prefix) == set()


def test_a_write_down_reuses_the_claims_bitmaps_and_works_them_out_for_the_rest(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bitmaps a batch touches are worked out once, at its claim; the write-down after
    it runs takes them from there. Records it never claimed (run without the guard while
    Redis was away) are worked out then, escaped references too."""
    parsed: list[str] = []
    each_block = once.each_block

    def counted(joined: str) -> list[once.Block]:
        parsed.append(joined)
        return each_block(joined)

    monkeypatch.setattr(once, "each_block", counted)
    claimed = make_items(["orders/1/5", "orders/1/9000", "job-%-7"])
    unclaimed = make_items(["orders/2/3", "odd\nref/2/4"])

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        try:
            assert await admission.guard.claim(GUARDED, claimed) == RUN * 3
            assert len(parsed) == 1
            await admission.guard.finish(GUARDED, claimed, [ok(0), ok(1), ok(2)])
            assert len(parsed) == 1  # the claim's blocks served the write-down
            await admission.guard.finish(GUARDED, unclaimed, [ok(0), ok(1)])
            assert len(parsed) == 2
            return [await admission.guard.claim(GUARDED, make_items(refs)) for refs in (
                ["orders/1/5", "orders/1/9000", "job-%-7"], ["orders/2/3", "odd\nref/2/4"])]
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [DONE * 3, DONE * 2]


def test_a_copy_read_while_a_success_is_being_written_waits_for_it(
        settings: Settings) -> None:
    """Between a chunk's end and its marks landing in Redis, the records are still this
    scheduler's: a copy claimed in that gap waits (it must not run beside a success not
    yet written), and once the marks land it is answered done."""
    batch = make_items(["orders/1/1"])

    async def scenario() -> list[str]:
        admission = RedisAdmission(settings)
        landed = _hold_finish(admission)
        try:
            seen = [await admission.guard.claim(GUARDED, batch)]
            writing = asyncio.create_task(admission.guard.finish(GUARDED, batch, [ok(0)]))
            for _ in range(5):
                await asyncio.sleep(0)  # the write is under way, not landed
            seen.append(await admission.guard.claim(GUARDED, batch))
            landed.set()
            await writing
            seen.append(await admission.guard.claim(GUARDED, batch))
            return seen
        finally:
            await admission.close()

    assert asyncio.run(scenario()) == [RUN, BUSY, DONE]


def _hold_finish(admission: RedisAdmission) -> asyncio.Event:
    """Hold ``admission``'s run-once write-downs (FINISH) until the returned event is set."""
    once = admission.guard.once
    real, landed = once._finish, asyncio.Event()

    async def held_finish(**kwargs: object) -> object:
        await landed.wait()
        return await real(**kwargs)

    once._finish = held_finish  # type: ignore[assignment]
    return landed


def test_one_bindings_broken_keys_fail_only_its_own_write(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Chunks of two bindings that end together are written in one go: when one binding's
    keys are broken (someone wrote a string where its hash lives), its finish fails and
    the other binding's marks still land and its finish returns."""
    broken = Binding("broken", Source("kafka", "broken"), "tests.funcs.basic:slow_record",
                     execution=Execution(timeout_s=5.0))
    first = make_items(["broken/0/1"], binding="broken")
    second = make_items(["orders/9/1"])

    async def scenario() -> tuple[list[object], str]:
        admission = RedisAdmission(settings)
        try:
            await admission.guard.claim(broken, first)
            await admission.guard.claim(GUARDED, second)
            spans = f"{settings.prefix}:{{once:broken}}:[0-9]*"
            for key in redis_client.scan_iter(match=spans):
                redis_client.delete(key)
                redis_client.set(key, "not a hash")
            ends = await asyncio.gather(admission.guard.finish(broken, first, [ok(0)]),
                                        admission.guard.finish(GUARDED, second, [ok(0)]),
                                        return_exceptions=True)
            return ends, await admission.guard.claim(GUARDED, second)
        finally:
            await admission.close()

    (broken_end, orders_end), codes = asyncio.run(scenario())
    assert isinstance(broken_end, redis.ResponseError), broken_end
    assert "WRONGTYPE" in str(broken_end)
    assert orders_end == set()
    assert codes == DONE  # the other binding's success was written down


def test_a_reply_the_writer_cannot_read_fails_its_chunk_instead_of_hanging_it(
        settings: Settings) -> None:
    """A reply of the wrong length for the records freed: that chunk's finish raises (the
    dispatcher logs it), and is not left waiting for good."""
    batch = make_items(["orders/5/1"])

    async def scenario() -> object:
        admission = RedisAdmission(settings)
        once = admission.guard.once

        async def garbled(**kwargs: object) -> object:
            return b"111"

        once._finish = garbled  # type: ignore[assignment]
        try:
            await admission.guard.claim(GUARDED, batch)
            return await asyncio.wait_for(
                asyncio.gather(admission.guard.finish(GUARDED, batch, [retry(0, "boom")]),
                               return_exceptions=True), 10)
        finally:
            await admission.close()

    (end,) = asyncio.run(scenario())  # type: ignore[misc]
    assert isinstance(end, ValueError), end


def test_a_chunk_spread_over_threads_writes_down_successes_while_it_still_runs(
        settings: Settings) -> None:
    """A sync chunk spread over threads ends its items over its parts' time: the successes
    are written down as they end (every EARLY_WRITE_S), not when its slowest part ends, so
    that a scheduler killed meanwhile does not run them again. Seen from another scheduler:
    the records that ended are done while the chunk's slow record still runs (busy)."""
    basic.reset()
    slow = [{"sleep": 1.5}] + [{"sleep": 0.005}] * 7
    refs = [f"orders/13/{n}" for n in range(8)]

    async def scenario() -> str:
        admission, other = RedisAdmission(settings), RedisAdmission(settings)
        scheduler = local_scheduler([GUARDED], admission=admission, guard=admission.guard,
                                    options=SchedulerOptions(workers=1))
        scheduler.start()
        try:
            for warm in range(2):  # measured: 5 ms an item, its chunks spread
                await scheduler.process(make_items(
                    [f"orders/14/{warm * 10 + n}" for n in range(8)], {"sleep": 0.005}))
            batch = [item | {"payload": json.dumps(body).encode()}  # type: ignore[operator]
                     for item, body in zip(make_items(refs), slow, strict=True)]
            call = asyncio.create_task(scheduler.process(batch))
            await asyncio.sleep(0.5)
            assert not call.done(), "the slow record ended too soon to tell"
            codes = await other.guard.claim(GUARDED, make_items(refs))
            await call
            return codes
        finally:
            await scheduler.stop()
            await admission.close()
            await other.close()

    assert asyncio.run(scenario()) == BUSY + DONE * 7


def test_a_chunk_that_succeeded_is_answered_before_its_marks_land_and_its_copy_waits(
        settings: Settings) -> None:
    """The write-down of a chunk does not hold its answer when every item succeeded: the
    batch is answered while the marks are still on their way. A copy of it sent meanwhile
    is refused a second run: it waits, and is answered ok once the marks land. A chunk
    with a failure is answered as early while this scheduler surely holds its records
    (no copy can have succeeded elsewhere), and only after its write landed when not."""
    basic.reset()
    refs = [f"orders/12/{n}" for n in range(6)]

    async def scenario() -> tuple[bool, dict[int, Outcome], bool, bool, Counter[str]]:
        admission = RedisAdmission(settings)
        landed = _hold_finish(admission)
        scheduler = local_scheduler([GUARDED], admission=admission, guard=admission.guard)
        scheduler.start()
        try:
            call = asyncio.create_task(scheduler.process(make_items(refs)))
            await asyncio.wait({call}, timeout=5)
            answered_early = call.done()
            if not answered_early:  # the answer waits for the marks: let it end (and fail)
                landed.set()
            first = await call
            answered_early = answered_early and all(o["status"] == "ok" for o in first)
            copy = asyncio.create_task(scheduler.process(make_items(refs)))
            held = asyncio.create_task(scheduler.process(
                make_items(["orders/12/100"], {"fail": True})))
            await asyncio.wait({held}, timeout=5)
            failed_early = held.done() and (await held)[0]["status"] == "retry"
            admission.guard.once.holds = lambda binding: False  # type: ignore[method-assign]
            failed = asyncio.create_task(scheduler.process(
                make_items(["orders/12/101"], {"fail": True})))
            await asyncio.sleep(0.3)  # a copy that ran again would have ended by now
            waiting = not copy.done() and not failed.done()
            landed.set()
            again = by_id(await asyncio.wait_for(copy, 10))
            await asyncio.wait_for(failed, 10)
            return answered_early and len(first) == 6, again, failed_early, waiting, runs_by_ref()
        finally:
            landed.set()
            await scheduler.stop()
            await admission.close()

    answered_early, again, failed_early, waiting, runs = asyncio.run(scenario())
    assert answered_early, "an all-ok chunk waited for its marks to land"
    assert failed_early, "a failed chunk of records surely held here waited for its write"
    assert waiting, "the copy or the failed chunk was answered before the write landed"
    assert [again[n]["status"] for n in range(6)] == ["ok"] * 6
    assert {runs[r] for r in refs} == {1}, "a copy of a record that succeeded ran again"


def test_a_holder_is_surely_alive_for_two_thirds_of_its_life_after_a_renewal(
        settings: Settings) -> None:
    """holds(): a claim, a range write or a beat renews it (from when it was sent); two
    thirds of the holder's life later it is no longer sure."""
    now = [1000.0]

    async def scenario() -> list[bool]:
        client = redis_asyncio.Redis.from_url(settings.redis_url)
        once = RunOnce(client, settings.names, holder_ttl_s=6.0, monotonic=lambda: now[0])
        try:
            seen = [once.holds("orders")]
            await once.claim("orders", make_items(["orders/40/1"]))
            seen.append(once.holds("orders"))
            now[0] += 3.9
            seen.append(once.holds("orders"))
            now[0] += 0.2
            seen.append(once.holds("orders"))
            await once._beat("orders")
            seen.append(once.holds("orders"))
            now[0] += 5
            _, write = once.run_fresh("orders", make_items(["orders/41/1"]))
            assert write is not None
            await write()
            seen.append(once.holds("orders") and not once.holds("other"))
            return seen
        finally:
            await once.close()
            await client.aclose()

    assert asyncio.run(scenario()) == [False, True, True, False, True, True]


def _fresh(items: list[Item]) -> list[Item]:
    for item in items:
        item["fresh"] = True
    return items


def test_a_fresh_record_runs_before_its_range_lands_and_is_written_down_after_it(
        settings: Settings, redis_client: redis.Redis) -> None:
    """A record its tailer knows was never sent before runs without waiting for Redis;
    its running range is written beside the run, and the write-down waits for it: the
    record ends done, no range left behind, and a copy read later is answered ok unrun."""
    basic.reset()
    refs = [f"orders/21/{n}" for n in range(4)]
    writing, release = asyncio.Event(), asyncio.Event()

    class Slow(RedisGuard):
        def run_fresh(self, binding: Binding, items: Sequence[Item]) -> Any:
            claim, write = super().run_fresh(binding, items)

            async def held() -> None:
                writing.set()
                await release.wait()
                assert write is not None
                await write
            return claim, held()

    async def scenario() -> tuple[int, list[Outcome], str]:
        slow, other = RedisAdmission(settings), RedisAdmission(settings)
        slow.guard = Slow(slow.guard.link)
        scheduler = local_scheduler([GUARDED], admission=slow, guard=slow.guard)
        scheduler.start()
        try:
            call = asyncio.create_task(scheduler.process(_fresh(make_items(refs))))
            await asyncio.wait_for(writing.wait(), 10)
            deadline = time.monotonic() + 10
            while len(basic.SEEN) < len(refs) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            ran_before_the_range = len(basic.SEEN)
            release.set()
            outcomes = await asyncio.wait_for(call, 10)
            await scheduler.dispatcher.claims.stop()  # the write-downs have landed
            return ran_before_the_range, outcomes, await other.guard.claim(
                GUARDED, make_items(refs))
        finally:
            await scheduler.stop()
            await slow.close()
            await other.close()

    ran, outcomes, later = asyncio.run(scenario())
    assert ran == len(refs)  # every one ran while its range was held back
    assert sorted(o["status"] for o in outcomes) == ["ok"] * len(refs)
    assert later == DONE * len(refs)
    assert _ranges(redis_client, settings) == []


def _ranges(client: redis.Redis, settings: Settings) -> list[str]:
    """Every running range of the binding ``orders`` left in Redis."""
    pattern = settings.names.once_key("orders", "running:*")
    return [m.decode() for key in client.scan_iter(match=pattern)
            for m in client.zrange(key, 0, -1)]


def test_a_copy_of_a_fresh_record_waits_while_it_runs_and_is_done_after(
        settings: Settings, redis_client: redis.Redis) -> None:
    """R1 of the design: a record that runs fresh in a (its range written, no claim per
    record) is read again and claimed by b: busy while a runs it; each success is done as
    its write-down lands; a failure is free once the range's last record ended, and the
    range is gone with it."""
    batch = make_items([f"orders/23/{n}" for n in range(10, 14)])

    async def scenario() -> list[str]:
        a, b = RedisAdmission(settings), RedisAdmission(settings)
        try:
            claim, write = a.guard.run_fresh(GUARDED, batch)
            assert claim == [] and write is not None
            await write
            seen = [await b.guard.claim(GUARDED, batch)]
            await a.guard.finish(GUARDED, batch[:2], [ok(0), ok(1)])
            seen.append(await b.guard.claim(GUARDED, batch))
            await a.guard.finish(GUARDED, batch[2:], [ok(2), retry(3, "boom")])
            seen.append(await b.guard.claim(GUARDED, batch))
            return seen
        finally:
            await a.close()
            await b.close()

    seen = asyncio.run(scenario())
    assert seen == [BUSY * 4, DONE * 2 + BUSY * 2, DONE * 3 + RUN]
    assert _ranges(redis_client, settings) == []


def test_a_fresh_record_of_a_scheduler_judged_dead_is_taken_over(
        settings: Settings, redis_client: redis.Redis) -> None:
    """R6: a runs records fresh and is judged dead (its holder gone); b takes them over
    (the dead range is removed) and succeeds with one; a's failure of that one is then
    done elsewhere, and the one b still runs stays b's."""
    batch = make_items(["orders/24/7", "orders/24/8"])
    copy = make_items(["orders/24/7", "orders/24/8"])  # the copies b and c read

    async def scenario() -> tuple[list[str], set[int]]:
        a, b, c = RedisAdmission(settings), RedisAdmission(settings), RedisAdmission(settings)
        try:
            _, write = a.guard.run_fresh(GUARDED, batch)
            assert write is not None
            await write
            redis_client.zrem(a.guard.once.holders("orders"), a.guard.once.holder)
            seen = [await b.guard.claim(GUARDED, copy)]
            assert _ranges(redis_client, settings) == []
            await b.guard.finish(GUARDED, copy[:1], [ok(0)])
            by_a = await a.guard.finish(GUARDED, batch, [retry(0, "boom"), retry(1, "boom")])
            seen.append(await c.guard.claim(GUARDED, copy))
            return seen, by_a
        finally:
            for admission in (a, b, c):
                await admission.close()

    seen, by_a = asyncio.run(scenario())
    assert seen == [TAKEN_OVER * 2, DONE + BUSY]
    assert by_a == {0}  # failed in a, done by b


def test_fresh_records_are_claimed_first_when_they_cannot_be_in_a_range(
        settings: Settings) -> None:
    """A fresh item that is no Kafka offset, one already running here, or a second copy in
    the batch is claimed as any record; a fail_closed binding claims all (it must not run
    before its claim)."""
    batch = make_items(["orders/25/1", "job-9", "orders/25/1", "orders/25/2"])
    closed = replace(GUARDED, limits=replace(GUARDED.limits, redis_policy="fail_closed"))

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        a = RedisAdmission(settings)
        try:
            claim, write = a.guard.run_fresh(GUARDED, batch)
            again, none = a.guard.run_fresh(GUARDED, batch[3:])
            assert write is not None and none is None
            await write
            closed_claim, none = a.guard.run_fresh(closed, batch)
            assert none is None
            return ([i["source_ref"] for i in claim], [i["source_ref"] for i in again],
                    [i["source_ref"] for i in closed_claim])
        finally:
            await a.close()

    claim, again, closed_claim = asyncio.run(scenario())
    assert claim == ["job-9", "orders/25/1"]
    assert again == ["orders/25/2"]
    assert closed_claim == [i["source_ref"] for i in batch]


def test_a_running_range_that_does_not_read_is_refused_said_and_removed(
        settings: Settings, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """A member of a running key that is no ``<lo>:<hi>:<holder>`` (anything may write to
    Redis) holds no record: the claim runs them, says so and removes it; a good range of
    a live holder beside it still holds its records."""
    batch = make_items(["orders/26/5", "orders/26/50"])

    async def scenario() -> tuple[str, list[str]]:
        a, b = RedisAdmission(settings), RedisAdmission(settings)
        try:
            _, write = a.guard.run_fresh(GUARDED, batch[1:])
            assert write is not None
            await write
            key = a.guard.once.prefix("orders") + "running:orders/26"
            redis_client.zadd(key, {"0:99:": 0, "junk": 0, "1:x:aaaa": 0})
            with caplog.at_level(logging.ERROR):
                codes = await b.guard.claim(GUARDED, batch)
            return codes, [m.decode() for m in redis_client.zrange(key, 0, -1)]
        finally:
            await a.close()
            await b.close()

    codes, left = asyncio.run(scenario())
    assert codes == RUN + BUSY
    assert len(left) == 1 and left[0].startswith("50:50:")
    assert "not a running range (<lo>:<hi>:<holder>); it was removed" in caplog.text
    assert "junk" in caplog.text


def test_a_copy_of_a_fresh_record_read_by_the_same_scheduler_waits_for_it(
        settings: Settings) -> None:
    """A fresh record is kept by its range, not per record: a guarded copy claimed by the
    scheduler that runs it is busy (not run beside it), done once written down; fresh
    records whose range would overlap one running here are claimed instead."""
    batch = make_items(["orders/27/3", "orders/27/4"])

    async def scenario() -> tuple[list[str], list[str]]:
        a = RedisAdmission(settings)
        try:
            _, write = a.guard.run_fresh(GUARDED, batch)
            assert write is not None
            await write
            seen = [await a.guard.claim(GUARDED, make_items(["orders/27/3", "orders/27/4"]))]
            overlapping, other = a.guard.run_fresh(GUARDED, make_items(["orders/27/4",
                                                                        "orders/28/1"]))
            assert other is not None  # orders/28/1 has a range of its own
            await other
            await a.guard.finish(GUARDED, batch, [ok(0), ok(1)])
            seen.append(await a.guard.claim(GUARDED, make_items(["orders/27/3"])))
            return seen, [i["source_ref"] for i in overlapping]
        finally:
            await a.close()

    seen, overlapping = asyncio.run(scenario())
    assert seen == [BUSY * 2, DONE]
    assert overlapping == ["orders/27/4"]


def test_a_reference_beside_a_range_that_is_no_offset_is_not_in_it(
        settings: Settings) -> None:
    async def scenario() -> list[bool]:
        a = RedisAdmission(settings)
        try:
            _, write = a.guard.run_fresh(GUARDED, make_items(["orders/30/1", "orders/30/9"]))
            assert write is not None
            await write
            once = a.guard.once
            return [once._runs_here("orders", ref)
                    for ref in ("orders/30/5", "orders/30/10", "orders/30/x", "orders/30/\u0663")]
        finally:
            await a.close()

    assert asyncio.run(scenario()) == [True, False, False, False]
