"""The Submitter's group commit: concurrent queue writes of a namespace written together,
each answered with its own results once stored (real PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from asynctier.dev.process import free_port
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import QueueError, QueueUnavailable
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.queue.store import QueueStore
from asynctier.submitter.backlog import FAR_BELOW, MAX_REUSE_S, Backlog
from asynctier.submitter.writers import GroupCommit
from tests.helpers import wait_until


@pytest.fixture
def queue(postgres: str) -> Iterator[ShardedQueue]:
    with ShardedQueue([postgres]) as sharded:
        yield sharded


def items(tag: str, n: int, topic: str = "work") -> list[NewItem]:
    return [NewItem(topic, b'{"n": %d}' % i, id=f"{tag}-{i}") for i in range(n)]


def test_concurrent_writes_share_one_statement_and_each_gets_its_own_results(
        queue: ShardedQueue, queue_store: QueueStore, queue_namespace: str) -> None:
    """Ten writes arriving together are one store call; each gets its own ids back, and
    an id another write of the group already wrote is that write's duplicate."""
    group = GroupCommit(queue, flushes=1)
    writes = [items(f"w{k}", 10) for k in range(10)]
    writes.append(items("w3", 2))  # the same ids as the fourth write

    async def go() -> list[list[tuple[str, bool]]]:
        done = await asyncio.gather(*(group.enqueue(queue_namespace, "work", w) for w in writes))
        return [[(r.id, r.created) for r in results] for results in done]

    answered = asyncio.run(go())
    assert group.calls == 1 and group.items == 102
    for write, results in zip(writes[:10], answered[:10], strict=True):
        assert results == [(i.id, True) for i in write]
    assert answered[10] == [("w3-0", False), ("w3-1", False)]
    [counts] = queue_store.counts(queue_namespace, "work")
    assert counts.ready == 100  # stored before the answers


def test_a_group_holds_at_most_max_rows(queue: ShardedQueue, queue_namespace: str) -> None:
    """Writes of 10 with at most 25 rows a call: two writes a call."""
    group = GroupCommit(queue, flushes=1, max_rows=25)

    async def go() -> None:
        await asyncio.gather(*(group.enqueue(queue_namespace, "work", items(f"m{k}", 10))
                               for k in range(10)))

    asyncio.run(go())
    assert (group.calls, group.items) == (5, 100)


def test_a_bad_item_refuses_its_own_write_only(queue: ShardedQueue, queue_store: QueueStore,
                                               queue_namespace: str) -> None:
    """A write with an invalid item fails alone; the writes beside it are stored."""
    group = GroupCommit(queue, flushes=1)
    bad = [NewItem("work", b"{}", id="ok"), NewItem("work", b"{}", id="x", priority=5000)]

    async def go() -> list[object]:
        return await asyncio.gather(group.enqueue(queue_namespace, "work", items("a", 3)),
                                    group.enqueue(queue_namespace, "work", bad),
                                    group.enqueue(queue_namespace, "work", items("b", 3)),
                                    return_exceptions=True)

    first, refused, last = asyncio.run(go())
    assert isinstance(refused, QueueError) and "priority 5000" in str(refused)
    assert [r.created for r in first] == [True] * 3  # type: ignore[attr-defined]
    assert [r.created for r in last] == [True] * 3  # type: ignore[attr-defined]
    [counts] = queue_store.counts(queue_namespace, "work")
    assert counts.ready == 6


def test_a_shard_that_is_down_fails_every_write_of_the_group() -> None:
    """PostgreSQL not answering: each waiting write gets QueueUnavailable (none is
    answered as stored), and the next writes are tried again."""
    store = ShardedQueue([f"postgresql://asynctier@127.0.0.1:{free_port()}/asynctier"],
                         timeout_s=1.0)
    group = GroupCommit(store, flushes=1)

    async def go() -> list[object]:
        return await asyncio.gather(*(group.enqueue("ns", "work", items(f"d{k}", 2))
                                      for k in range(4)), return_exceptions=True)

    try:
        failed = asyncio.run(go())
        assert all(isinstance(f, QueueUnavailable) for f in failed), failed
        with pytest.raises(QueueUnavailable):
            asyncio.run(group.enqueue("ns", "work", items("again", 1)))
    finally:
        store.close()


def test_the_backlog_reading_counts_ready_and_delayed_items_up_to_its_limit(
        queue_store: QueueStore, queue_namespace: str) -> None:
    """``waiting``: ready + delayed (as ``counts`` has them), leased ones left out, and
    never more than the limit (the Submitter's backlog check reads at most its cap)."""
    queue_store.enqueue(queue_namespace, items("r", 20, "wt"))
    queue_store.enqueue(queue_namespace, [NewItem("wt", b"{}", id=f"late{i}", delay_s=600)
                                          for i in range(5)])
    queue_store.lease(queue_namespace, "wt", 4, 30.0, "owner")
    [counts] = queue_store.counts(queue_namespace, "wt")
    assert queue_store.waiting(queue_namespace, "wt", 1000) == counts.ready + counts.delayed
    assert queue_store.waiting(queue_namespace, "wt", 1000) == 21
    assert queue_store.waiting(queue_namespace, "wt", 10) == 10


def test_a_backlog_reading_far_under_the_cap_is_reused_longer(
        queue: ShardedQueue, queue_store: QueueStore, queue_namespace: str) -> None:
    """A reading is read again after ``recheck_s`` near the cap, but reused for 5 s when
    the cap is FAR_BELOW items away (a long topic's count is PostgreSQL's work)."""
    now = [100.0]
    binding = Binding("b", Source("queue", "wb"), "bench.noop:noop", tenant=queue_namespace)
    near = Backlog(Settings(), queue, cap=30, recheck_s=1.0, clock=lambda: now[0])
    far = Backlog(Settings(), queue, cap=FAR_BELOW + 10, recheck_s=1.0, clock=lambda: now[0])

    async def over() -> tuple[int | None, int | None]:
        return await near.over_cap(binding), await far.over_cap(binding)

    try:
        assert asyncio.run(over()) == (None, None)
        queue_store.enqueue(queue_namespace, items("b", 40, "wb"))
        now[0] += 1.5  # past recheck_s: the near cap reads again, the far one does not
        assert asyncio.run(over()) == (30, None)  # counted up to the cap
        assert far._seen["b"][1] == 0
        now[0] += MAX_REUSE_S
        asyncio.run(over())
        assert far._seen["b"][1] == 40
    finally:
        near.close()
        far.close()


def test_the_delivery_report_thread_comes_back_after_it_fails() -> None:
    """The thread that serves the producer's delivery reports is supervised: a poll that
    raises (a report callback's error, say) is counted and the polling goes on, instead of
    every later Kafka write waiting for a report that never comes."""
    from prometheus_client import REGISTRY

    from asynctier.submitter.writers import KafkaWriter

    def restarts() -> float:
        return REGISTRY.get_sample_value(
            "asynctier_task_restarts_total",
            {"task": "submitter-producer", "reason": "RuntimeError"}) or 0.0

    class Failing:
        def __init__(self) -> None:
            self.polls = 0

        def poll(self, timeout: float) -> int:
            self.polls += 1
            if self.polls == 1:
                raise RuntimeError("a report callback failed")
            return 0

        def flush(self, timeout: float) -> int:
            return 0

    before = restarts()
    writer = KafkaWriter(Settings(kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"}))
    fake = Failing()
    writer._producer.flush(0)
    writer._producer = fake  # type: ignore[assignment]
    try:
        wait_until(lambda: restarts() == before + 1 and fake.polls > 5, 10,
                   "the poll thread restarted and polls again")
    finally:
        writer.close()
