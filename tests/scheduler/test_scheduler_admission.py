"""The dispatcher's use of the Admission protocol: quota, tokens, slots, reports.

``Recording`` is a plain in-memory implementation of the protocol (no Redis involved;
the Redis-backed one is tested with the limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Limits, Source
from asynctier.platform.wire import Item
from asynctier.scheduler import SchedulerOptions
from tests.scheduler_harness import by_id, item, items, local_scheduler


class Recording:
    """Refuses odd ids as over quota, caps slots at ``cap``, records every call."""

    def __init__(self, cap: int = 2) -> None:
        self.tokens: list[int] = []
        self.reports: list[tuple[int, int]] = []
        self.running = 0
        self.peak = 0
        self.cap = asyncio.Semaphore(cap)
        self.quota_on = False
        self.broken = False
        self.lock = threading.Lock()

    async def over_quota(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        if self.broken:
            raise ConnectionError("redis is down")
        return {i["id"]: 42.0 for i in items if self.quota_on and i["id"] % 2}

    async def take_tokens(self, binding: Binding, n: int) -> None:
        self.tokens.append(n)

    @contextlib.asynccontextmanager
    async def slot(self, binding: Binding) -> AsyncIterator[None]:
        async with self.cap:
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                yield
            finally:
                self.running -= 1

    def concurrency_limit(self, binding: Binding) -> int | None:
        return None

    def report(self, binding: Binding, ok: int, failed: int) -> None:
        self.reports.append((ok, failed))

    async def close(self) -> None:
        pass


def test_over_quota_items_come_back_without_spending_an_attempt() -> None:
    admission = Recording()
    admission.quota_on = True
    binding = Binding("b", Source("kafka", "t"), "tests.funcs.basic:noop")

    async def scenario() -> None:
        scheduler = local_scheduler([binding], admission=admission)
        scheduler.start()
        outcomes = by_id(await scheduler.process(items("b", 10)))
        await scheduler.stop()
        for n in range(10):
            if n % 2:
                assert outcomes[n]["status"] == "retry"
                assert outcomes[n]["after_s"] == 42.0 and not outcomes[n]["spends_attempt"]
                assert "over its quota" in (outcomes[n]["error"] or "")
            else:
                assert outcomes[n]["status"] == "ok"

    asyncio.run(scenario())
    assert sum(admission.tokens) == 5  # tokens only for the admitted items, per chunk
    assert sum(ok for ok, _ in admission.reports) == 5


def test_tokens_are_taken_per_chunk_and_failures_reported() -> None:
    admission = Recording()
    good = Binding("good", Source("kafka", "t"), "tests.funcs.basic:noop")
    bad = Binding("bad", Source("kafka", "t"), "tests.funcs.basic:boom")

    async def scenario() -> None:
        scheduler = local_scheduler([good, bad], admission=admission)
        scheduler.start()
        batch = items("good", 100) + [item("bad", 1000 + n) for n in range(50)]
        batch += [item("good", 2000, b"not json")]  # bad input is not the downstream's fault
        await scheduler.process(batch)
        await scheduler.stop()

    asyncio.run(scenario())
    assert sum(admission.tokens) == 151
    assert len(admission.tokens) >= 2  # one call per chunk, never per item
    assert sum(ok for ok, _ in admission.reports) == 100
    assert sum(bad for _, bad in admission.reports) == 50


def test_a_capped_binding_runs_items_inside_slots() -> None:
    admission = Recording(cap=3)
    capped = Binding("capped", Source("kafka", "t"), "tests.funcs.basic:sleepy",
                     limits=Limits(max_concurrency=3))
    payload = json.dumps({"sleep": 0.01}).encode()

    async def scenario() -> None:
        scheduler = local_scheduler([capped], admission=admission,
                                    options=SchedulerOptions(workers=8))
        scheduler.start()
        calls = [scheduler.process([item("capped", k * 100 + n, payload) for n in range(40)])
                 for k in range(4)]
        results = await asyncio.gather(*calls)
        await scheduler.stop()
        assert all(o["status"] == "ok" for r in results for o in r)

    asyncio.run(scenario())
    assert admission.peak == 3


def test_admission_errors_bring_items_back_later() -> None:
    admission = Recording()
    admission.broken = True
    binding = Binding("b", Source("kafka", "t"), "tests.funcs.basic:noop")

    async def scenario() -> None:
        scheduler = local_scheduler([binding], admission=admission)
        scheduler.start()
        outcomes = await scheduler.process(items("b", 5))
        await scheduler.stop()
        assert all(o["status"] == "retry" and not o["spends_attempt"] and o["after_s"] == 5.0
                   for o in outcomes)
        assert "admission failed: ConnectionError: redis is down" in (outcomes[0]["error"] or "")

    asyncio.run(scenario())


def test_a_high_cap_is_filled_by_async_functions() -> None:
    admission = Recording(cap=50)
    capped = Binding("wide", Source("kafka", "t"), "tests.funcs.basic:async_sleepy",
                     limits=Limits(max_concurrency=50))
    payload = json.dumps({"sleep": 0.05}).encode()

    async def scenario() -> None:
        scheduler = local_scheduler([capped], admission=admission)
        scheduler.start()
        outcomes = await scheduler.process([item("wide", n, payload) for n in range(300)])
        await scheduler.stop()
        assert len(outcomes) == 300 and all(o["status"] == "ok" for o in outcomes)

    asyncio.run(scenario())
    assert admission.peak == 50


class Adaptive(Recording):
    """Also offers an adaptive (AIMD) limit, as RedisAdmission does."""

    def concurrency_limit(self, binding: Binding) -> int | None:
        return 2


def test_an_adaptive_limit_narrows_a_capped_binding() -> None:
    admission = Adaptive(cap=100)
    binding = Binding("b", Source("kafka", "t"), "tests.funcs.basic:async_sleepy",
                      limits=Limits(max_concurrency=10))
    payload = json.dumps({"sleep": 0.01}).encode()

    async def scenario() -> None:
        scheduler = local_scheduler([binding], admission=admission)
        scheduler.start()
        outcomes = await scheduler.process([item("b", n, payload) for n in range(40)])
        await scheduler.stop()
        assert all(o["status"] == "ok" for o in outcomes)

    asyncio.run(scenario())
    assert 1 <= admission.peak <= 2 * 2  # two lanes per chunk, two chunks per binding


def test_an_uncapped_binding_is_never_slowed_by_the_adaptive_limit() -> None:
    """A failing uncapped binding must still drain at full speed (docs/design.md, invariant 3)."""
    admission = Adaptive(cap=100)
    binding = Binding("b", Source("kafka", "t"), "tests.funcs.basic:async_sleepy")
    payload = json.dumps({"sleep": 0.05}).encode()

    async def scenario() -> float:
        scheduler = local_scheduler([binding], admission=admission)
        scheduler.start()
        started = time.monotonic()
        outcomes = await scheduler.process([item("b", n, payload) for n in range(64)])
        took = time.monotonic() - started
        await scheduler.stop()
        assert all(o["status"] == "ok" for o in outcomes)
        return took

    took = asyncio.run(scenario())
    assert admission.peak == 0  # no slot was asked for
    assert took < 64 * 0.05 / 4  # far more than 2 at a time
