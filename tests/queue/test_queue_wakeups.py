"""Prompt pickup on a real PostgreSQL: an enqueue of ready items wakes the tailers of its
topic through LISTEN/NOTIFY; a lost listener comes back by itself, and the poll remains."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.supervise import RestartPolicy
from asynctier.queue import NewItem, QueueStore, wakeups
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers import long_work
from asynctier.tailers import queue as queue_tailer
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import no_hook
from asynctier.tailers.queue import QueueSource
from tests.helpers import wait_until
from tests.scheduler_harness import running_scheduler


def test_a_ready_enqueue_wakes_its_topic_and_a_delayed_one_does_not(
        postgres: str, queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    listener = wakeups.Wakeups("test", lambda: postgres).start()
    try:
        wait_until(lambda: listener.listening, 10, "the listener listens")
        mine, other, child = threading.Event(), threading.Event(), threading.Event()
        listener.subscribe(ns, "jobs", mine.set)
        listener.subscribe(ns, "other", other.set)
        queue_store.enqueue(ns, [NewItem("jobs", b"{}", delay_s=60)])
        assert not mine.wait(0.3), "a delayed item is found by the poll, not woken for"
        queue_store.enqueue(ns, [NewItem("jobs", b"{}"), NewItem("jobs", b"{}")])
        assert mine.wait(5), "a ready item wakes its topic"
        assert not other.is_set()
        mine.clear()
        queue_store.enqueue(ns, [NewItem("jobs", b"{}", id="same")])
        assert mine.wait(5)
        mine.clear()
        queue_store.enqueue(ns, [NewItem("jobs", b"{}", id="same")])  # a duplicate: no news
        assert not mine.wait(0.3)
        # a child waiting for its parent: its topic wakes when the parent's ack releases it
        listener.subscribe(ns, "publish", child.set)
        queue_store.enqueue(ns, [NewItem("encode", b"{}", id="p"),
                                 NewItem("publish", b"{}", id="c", after=[("encode", "p")])])
        assert not child.wait(0.3), "the child waits"
        [parent] = queue_store.lease(ns, "encode", 1, 30, "w")
        queue_store.resolve(ns, "encode", "w", acks=[parent.id])
        assert child.wait(5), "the release woke the child's topic"
    finally:
        listener.stop()


def test_the_tailer_leases_as_soon_as_an_item_is_enqueued(
        postgres: str, queue_store: QueueStore, queue_namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the poll set to 30 s, an idle source still leases an item within a second of
    its enqueue: the notification woke it."""
    monkeypatch.setattr(queue_tailer, "IDLE_POLL_S", 30.0)
    binding = Binding(name="prompt", source=Source("queue", "prompt"), function="m:f",
                      tenant=queue_namespace)
    with ShardedQueue([postgres]) as queue:
        source = QueueSource(binding, queue, "tailer", threading.Event())
        try:
            wait_until(lambda: source._wakeups.listening, 10, "the listener listens")
            assert source.read(10, 0.0) == []  # empty: quiet for 30 s from now
            enqueued_at: list[float] = []
            waiting = threading.Event()
            wait = source._woken.wait

            def watched(timeout: float | None = None) -> bool:
                waiting.set()
                return wait(timeout)

            source._woken.wait = watched  # type: ignore[method-assign]

            def enqueue_later() -> None:
                assert waiting.wait(10), "the source never waited"
                enqueued_at.append(time.monotonic())
                queue_store.enqueue(queue_namespace, [NewItem("prompt", b"{}", id="x")])

            threading.Thread(target=enqueue_later).start()
            got = source.read(10, 10.0)
            waited = time.monotonic() - enqueued_at[0]
        finally:
            source.close()
    assert [item.id for item in got] == ["x"]
    assert waited < 1.0, f"leased {waited:.3f}s after the enqueue"


def test_an_item_enqueued_while_another_runs_starts_at_once(
        settings: Settings, postgres: str, queue_store: QueueStore, queue_namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Long work with an item running waits for that item's messages: a wake-up ends the
    wait too, so the item enqueued meanwhile starts within a second, not at the running
    item's next message (the waits and polls are set to 30 s: only a wake-up is quick)."""
    monkeypatch.setattr(queue_tailer, "IDLE_POLL_S", 30.0)
    monkeypatch.setattr(long_work, "EVENT_WAIT_S", 30.0)
    ns = queue_namespace
    binding = Binding(name="busy", source=Source("queue", "busy", lease_s=120),
                      function="tests.funcs.basic:async_sleepy", tenant=ns)
    stop = threading.Event()
    with running_scheduler(settings, [binding]) as sched, ShardedQueue([postgres]) as queue:
        source = QueueSource(binding, queue, "tailer", stop)
        loop = long_work.LongWork(source, sched.client, TailerOptions(idle_poll_s=30.0),
                                  no_hook)
        thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: source._wakeups.listening, 10, "the listener listens")

            def gone(item_id: str) -> bool:
                return queue_store.get(ns, "busy", item_id) is None

            queue_store.enqueue(ns, [NewItem("busy", b'{"sleep": 4}', id="slow")])
            wait_until(lambda: "slow" in loop.running, 5, "the slow item runs")
            enqueued = time.monotonic()
            queue_store.enqueue(ns, [NewItem("busy", b'{"sleep": 0}', id="quick")])
            wait_until(lambda: gone("quick"), 10, "the quick item ran and was acked")
            waited = time.monotonic() - enqueued
            assert waited < 1.0, f"the quick item waited {waited:.2f}s beside the slow one"
            assert not gone("slow")
            wait_until(lambda: gone("slow"), 20, "the slow item ran and was acked")
        finally:
            stop.set()
            source._woken.set()  # its read waits up to the 30 s poll otherwise
            thread.join(30)
            source.close()
    assert not thread.is_alive()


def test_a_listener_whose_connection_is_killed_comes_back(
        postgres: str, queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    listener = wakeups.Wakeups("killed", lambda: postgres)
    listener.policy = RestartPolicy(first_s=0.1, max_s=0.5)
    listener.start()
    try:
        wait_until(lambda: listener.listening, 10, "the listener listens")
        event = threading.Event()
        listener.subscribe(ns, "jobs", event.set)
        with psycopg.connect(postgres, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE %s AND pid <> pg_backend_pid()",
                (f"LISTEN {wakeups.CHANNEL}%",)).fetchall()
        assert killed, "the listener's backend was found"
        wait_until(lambda: listener.restarts >= 1 and listener.listening, 10,
                   "the listener restarted")
        event.clear()
        queue_store.enqueue(ns, [NewItem("jobs", b"{}")])
        assert event.wait(5), "woken again after the restart"
    finally:
        listener.stop()
