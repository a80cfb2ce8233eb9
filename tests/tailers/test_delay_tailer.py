"""Delay tailers on the real Kafka: records come back no earlier than due, hop through the
ladder, resolve like the main tailer's, and a removed binding's records become dead letters.

The first attempt's failure is handed off exactly as the main tailer does it
(:meth:`Handoff.resolve`); the delay tailers run in this process against
:class:`tests.funcs.delay.LocalScheduler`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asynctier.delay_streams.handoff import Handoff, Parcel
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform import names as n
from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.delay import DelayOptions, run_delay_tailers
from tests.funcs import ledger
from tests.funcs.delay import LocalScheduler
from tests.helpers import record_headers, wait_until
from tests.platform_harness import committed_vs_end, read_topic

LADDER = (1.0, 2.0, 4.0)


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ledger the test functions write to."""
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("ASYNCTIER_TEST_LEDGER", str(path))
    monkeypatch.setattr(ledger, "_fd", None)
    return path


@pytest.fixture
def scheduler() -> Iterator[LocalScheduler]:
    """A scheduler in this process; map binding names to functions in ``.functions``."""
    local = LocalScheduler({})
    local.start()
    yield local
    local.stop()


class DelayProcess:
    """``run_delay_tailers`` in a thread of the test."""

    def __init__(self, settings: Settings, address: str) -> None:
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.client = SchedulerClient(lambda: [address])
        self.thread = threading.Thread(
            target=run_delay_tailers, args=(settings, self.stop, self.client, self.ready.set,
                                            DelayOptions(ready_timeout_s=20)), daemon=True)

    def start(self) -> DelayProcess:
        self.thread.start()
        assert self.ready.wait(60), "the delay tailers did not get ready"
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        self.client.close()
        assert not self.thread.is_alive(), "the delay tailers did not stop"


def bind(settings: Settings, name: str, max_attempts: int = 5) -> Binding:
    """Store a binding (ledger function, short ladder) and create its topics."""
    binding = Binding(name, Source("kafka", f"{settings.prefix}.src"), "tests.funcs.ledger:record",
                      retries=Retries(max_attempts, LADDER))
    BindingRegistry(settings).put(binding)
    ensure_binding_topics(settings, [binding])
    return binding


def fail_first_attempts(settings: Settings, binding: Binding, docs: list[dict[str, Any]],
                        after_s: float | None = None, handoff: Handoff | None = None) -> float:
    """Hand off attempt 1 of each doc as failed, as the main tailer would; returns the time
    just before the hand-off (every record is due no earlier than that + the delay)."""
    handoff = handoff or Handoff(settings)
    before = time.time()
    for i, doc in enumerate(docs):
        parcel = Parcel(value=json.dumps(doc).encode(), key=str(doc["id"]).encode(),
                        headers=[("trace", b"t-%d" % i)], origin=f"{binding.source.topic}/0/{i}",
                        attempt=1, first_seen_ms=int(before * 1000))
        handoff.resolve(binding, parcel, wire.retry(i, "boom", after_s))
    handoff.confirm()
    return before


def due_by_key(settings: Settings, step: str) -> dict[bytes, float]:
    """The due time (epoch s) of each record in a delay topic, by key."""
    return {m.key(): int(record_headers(m)[n.H_DUE] or 0) / 1000.0  # type: ignore[attr-defined]
            for m in read_topic(settings, settings.names.delay_topic(step))}


def calls_by_id(path: Path) -> dict[int, list[ledger.Call]]:
    """Ledger calls grouped by id, in attempt order."""
    out: dict[int, list[ledger.Call]] = {}
    for call in ledger.read(path):
        out.setdefault(call.id, []).append(call)
    for calls in out.values():
        calls.sort(key=lambda c: c.attempt)
    return out


def test_retries_come_back_in_order_never_early(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    binding = bind(settings, "orders")
    scheduler.functions["orders"] = ledger.record
    count = 2000
    delay = DelayProcess(settings, scheduler.address).start()
    try:
        before = fail_first_attempts(settings, binding,
                                     [{"id": i, "fail_until": 3} for i in range(count)])
        wait_until(lambda: len(ledger.read(ledger_file)) >= 2 * count, 60,
                   "attempts 2 and 3 of every record")
        calls = calls_by_id(ledger_file)
        assert sorted(calls) == list(range(count))
        due = due_by_key(settings, "1s")
        late = []
        for i, calls_of_id in calls.items():
            second, third = calls_of_id
            assert (second.attempt, third.attempt) == (2, 3)
            assert second.at >= before + 1.0, "attempt 2 ran before its due time"
            assert second.at >= due[str(i).encode()], "attempt 2 ran before its due time"
            assert third.at >= second.at + 2.0, "attempt 3 ran before its due time"
            late.append(second.at - due[str(i).encode()])
        late.sort()
        print(f"\nlateness of attempt 2 after its due time: median {late[len(late) // 2]:.3f}s, "
              f"p99 {late[len(late) * 99 // 100]:.3f}s, max {late[-1]:.3f}s")
        assert late[-1] < 2.0
        for step in ("1s", "2s"):
            topic = settings.names.delay_topic(step)
            wait_until(lambda t=topic: committed_vs_end(settings, t, t)[0] == count, 30,
                       f"the delay group of {step} committed every record")
    finally:
        delay.close()


def test_retry_after_7_hops_4_2_1_and_runs_no_earlier(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    binding = bind(settings, "hops")
    scheduler.functions["hops"] = ledger.record
    delay = DelayProcess(settings, scheduler.address).start()
    try:
        # A warm producer, as the main tailer's is: the hops are planned from the time the
        # record is due, so a slow first write (metadata) may save the last hop.
        handoff = Handoff(settings)
        fail_first_attempts(settings, binding, [{"id": 0}], after_s=7, handoff=handoff)
        before = fail_first_attempts(settings, binding, [{"id": 1}], after_s=7,
                                     handoff=handoff)
        wait_until(lambda: len(ledger.read(ledger_file)) == 2, 30, "the retried records ran")
        (call,) = [c for c in ledger.read(ledger_file) if c.id == 1]
        assert call.attempt == 2
        assert call.at >= before + 7.0
        assert call.at < before + 7.0 + 3.0
        for step in ("4s", "2s", "1s"):
            records = [m for m in read_topic(settings, settings.names.delay_topic(step))
                       if m.key() == b"1"]  # type: ignore[attr-defined]
            assert len(records) == 1, f"expected one hop through {step}"
    finally:
        delay.close()


def test_exhausted_attempts_land_in_the_dead_letter_topic_with_the_original_record(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    binding = bind(settings, "doomed", max_attempts=3)
    scheduler.functions["doomed"] = ledger.record
    docs = [{"id": i, "always_fail": True} for i in range(20)]
    fail_first_attempts(settings, binding, docs)
    delay = DelayProcess(settings, scheduler.address).start()
    try:
        dlq = settings.names.dlq_topic("doomed")
        wait_until(lambda: len(read_topic(settings, dlq)) >= len(docs), 30, "every dead letter")
        attempts = {i: [c.attempt for c in calls] for i, calls in
                    calls_by_id(ledger_file).items()}
        assert attempts == {i: [2, 3] for i in range(len(docs))}
        for msg in read_topic(settings, dlq):
            headers = dict(msg.headers())  # type: ignore[attr-defined]
            doc = json.loads(msg.value())  # type: ignore[attr-defined]
            assert msg.value() == json.dumps(docs[doc["id"]]).encode()  # type: ignore[attr-defined]
            assert msg.key() == str(doc["id"]).encode()  # type: ignore[attr-defined]
            assert headers[n.H_ATTEMPTS_MADE] == b"3"
            assert headers[n.H_REASON] == b"max_attempts"
            assert b"always fails" in headers[n.H_ERROR]
            assert headers["trace"].startswith(b"t-")
    finally:
        delay.close()


def test_a_removed_bindings_records_become_dead_letters(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:
    binding = bind(settings, "gone")
    scheduler.functions["gone"] = ledger.record
    fail_first_attempts(settings, binding, [{"id": i} for i in range(5)], after_s=4)
    BindingRegistry(settings).delete("gone")
    delay = DelayProcess(settings, scheduler.address).start()
    try:
        dlq = settings.names.dlq_topic("gone")
        wait_until(lambda: len(read_topic(settings, dlq)) >= 5, 30, "the orphans' dead letters")
        reasons = {dict(m.headers())[n.H_REASON] for m in read_topic(settings, dlq)}  # type: ignore[attr-defined]
        assert reasons == {b"binding_removed"}
        assert ledger.read(ledger_file) == []
    finally:
        delay.close()
