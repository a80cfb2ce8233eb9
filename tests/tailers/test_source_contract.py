"""A second kind of source runs on the one pipeline and the real scheduler: a test-only
list source (tests/list_source.py) whose retries are nacks and whose failures are dead
items, resolved by that source; nothing of ``scheduler/`` knows of it."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import SOURCE_KINDS, Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.rpc import PendingCall, SchedulerClient
from asynctier.scheduler import SchedulerOptions
from asynctier.tailers.options import PipelineOptions
from asynctier.tailers.pipeline import Pipeline
from asynctier.tailers.registry import SOURCES
from tests.funcs import basic
from tests.helpers import wait_until
from tests.list_source import ListSource, Nack
from tests.scheduler_harness import Running, running_scheduler

BINDINGS = [
    Binding("rec", Source("kafka", "list"), "tests.funcs.basic:record"),
    Binding("timed", Source("kafka", "list"), "tests.funcs.basic:timed"),
    Binding("retry", Source("kafka", "list"), "tests.funcs.basic:retry_later"),
    Binding("reject", Source("kafka", "list"), "tests.funcs.basic:reject"),
    Binding("slow", Source("kafka", "list"), "tests.funcs.basic:sleepy",
            execution=Execution(timeout_s=0.3)),
]


@pytest.fixture(scope="module")
def sched(kafka_bootstrap: str, redis_url: str) -> Iterator[Running]:
    settings = Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                        prefix="t" + uuid.uuid4().hex[:10])
    with running_scheduler(settings, BINDINGS, options=SchedulerOptions(workers=4)) as run:
        yield run


class _Counted:
    """A call under way, as the pipeline sees it; counted out when its result is taken."""

    def __init__(self, call: PendingCall, done: Any) -> None:
        self.call, self.done = call, done

    @property
    def future(self) -> Future[bytes]:
        return self.call.future

    def result(self, stop: threading.Event | None = None) -> Any:
        outcomes = self.call.result(stop)
        self.done()
        return outcomes


class CountingClient:
    """The real client; counts the calls under way (sent, their outcomes not yet taken)."""

    def __init__(self, client: SchedulerClient) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.under_way = self.peak = self.calls = 0

    def submit_encoded(self, payload: bytes, count: int,
                       spread: str | None = None) -> _Counted:
        with self.lock:
            self.under_way += 1
            self.calls += 1
            self.peak = max(self.peak, self.under_way)
        return _Counted(self.client.submit_encoded(payload, count, spread), self._done)

    def _done(self) -> None:
        with self.lock:
            self.under_way -= 1


def _run(source: ListSource, client: Any, total: int, options: PipelineOptions) -> None:
    """The pipeline on ``source`` in a thread until every item is checkpointed, then
    stopped."""
    pipeline = Pipeline(source, client, "tailer", "list", options)
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(stop)
        except BaseException as exc:
            failures.append(exc)
            raise

    thread = threading.Thread(target=run, name="list-pipeline", daemon=True)
    thread.start()
    try:
        wait_until(lambda: failures or len(source.checkpointed) >= total, 120,
                   f"all {total} items checkpointed")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not failures, failures


def _payload(**doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_a_list_source_runs_on_the_real_pipeline_and_scheduler(sched: Running) -> None:
    basic.reset()
    entries: list[tuple[str, bytes | None]] = []
    kinds: dict[int, str] = {}
    for i in range(60):
        kind = ["rec", "timed", "retry", "reject", "rec", "timed"][i % 6]
        payload = _payload(n=i, ms=5) if kind == "timed" else _payload(n=i)
        if i == 7:
            kind, payload = "rec", b"{not json"  # undecodable
        if i == 13:
            kind, payload = "slow", _payload(sleep=2)  # past its 0.3 s timeout
        kinds[len(entries)] = kind if i != 7 else "undecodable"
        entries.append((kind, payload))
    source = ListSource(BINDINGS, entries)
    client = CountingClient(sched.client)
    _run(source, client, len(entries), PipelineOptions(batch_size=5, max_in_flight=2,
                                                       linger_s=0.0, idle_poll_s=0.05))
    ok = [n for n, k in kinds.items() if k in ("rec", "timed")]
    # every item answered exactly once: acked, nacked or dead, and checkpointed once
    resolved = Counter(source.acks + [x.n for x in source.nacks] + [n for n, _ in source.dead])
    assert resolved == Counter(range(len(entries)))
    assert source.checkpointed == list(range(len(entries)))  # checkpoints in read order
    assert source.acks == ok  # ok items acked, in order
    assert sorted(p["n"] for p, _ in basic.SEEN) == [n for n in ok if kinds[n] == "rec"]
    nacks = {x.n: x for x in source.nacks}
    for n in (n for n, k in kinds.items() if k == "retry"):
        assert nacks[n].after_s == 7.0, nacks[n]  # Retry(after=7)
    slow = BINDINGS[4]
    assert nacks[13] == Nack(13, slow.retries.ladder_s[0], "timeout")  # its ladder's step
    dead = dict(source.dead)
    assert {n: dead[n] for n, k in kinds.items() if k == "reject"} == {
        n: "rejected" for n, k in kinds.items() if k == "reject"}
    assert dead[7] == "undecodable"
    assert source.confirmed >= 1
    # max_in_flight respected, and used: never more than 2 calls under way, 2 at times
    assert client.peak == 2, client.peak
    assert client.calls == len(entries) // 5


def test_a_refused_confirm_is_retried_and_nothing_is_checkpointed_before_it_lands(
        sched: Running) -> None:
    entries: list[tuple[str, bytes | None]] = [
        ("retry" if i % 2 else "rec", _payload(n=i)) for i in range(10)]
    source = ListSource(BINDINGS, entries, refuse_confirms=1)
    _run(source, sched.client, len(entries),
         PipelineOptions(batch_size=5, max_in_flight=2, linger_s=0.0, idle_poll_s=0.05,
                         handoff_retry_s=0.05))
    events = source.events
    refused = events.index(("confirm", "refused"))
    landed = events.index(("confirm", "ok"))
    assert refused < landed
    assert not any(e[0] == "checkpoint" for e in events[:landed])  # none before it landed
    # the pipeline handed the batch off again after the refusal, then it landed
    assert ("hand_off", [0, 1, 2, 3, 4]) in events[refused:landed]
    assert source.checkpointed == list(range(10))
    assert sorted(x.n for x in source.nacks) == [1, 3, 5, 7, 9]  # each once: none lost
    assert source.acks == [0, 2, 4, 6, 8]


def test_every_source_kind_a_binding_may_name_has_a_source() -> None:
    assert set(SOURCE_KINDS) <= set(SOURCES), set(SOURCE_KINDS) - set(SOURCES)
