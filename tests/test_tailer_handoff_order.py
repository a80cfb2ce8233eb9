"""The order of a tailer's work when a batch has records to hand off (pure logic: the
consumer, the scheduler call and the hand-off are stand-ins that log what is done).

The next batch leaves for the scheduler before the answered batch's hand-offs are produced
(they are produced while that call runs), and offsets are committed only after the
hand-offs they cover are confirmed, oldest batch first. A batch that is all ``ok`` is
committed at once, and with nothing to send the hand-offs do not wait for the call under
way. The real hand-offs are exercised by tests/faults and the delay tests."""

from __future__ import annotations

import threading
from collections import Counter, deque
from concurrent.futures import Future
from typing import Any

from asynctier.platform import wire
from asynctier.tailers.kafka import KafkaTailer, TailerOptions, _Batch


class _Msg:
    def __init__(self, offset: int) -> None:
        self.o = offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.o

    def error(self) -> None:
        return None


class _Call:
    """A submit call whose answer is given by the test."""

    def __init__(self, outcomes: list[wire.Outcome] | None = None) -> None:
        self.future: Future[bytes] = Future()
        self.outcomes: list[wire.Outcome] = []
        if outcomes is not None:
            self.answer(outcomes)

    def answer(self, outcomes: list[wire.Outcome]) -> None:
        self.outcomes = outcomes
        self.future.set_result(b"")

    def result(self, stop: threading.Event | None = None) -> list[wire.Outcome]:
        return self.outcomes


def _tailer(log: list[tuple[Any, ...]], ready: list[_Msg]) -> KafkaTailer:
    tailer = KafkaTailer.__new__(KafkaTailer)
    tailer.options = TailerOptions(batch_size=2, max_in_flight=2, linger_s=0.0)
    tailer.binding = type("B", (), {"name": "orders", "topic": "t", "tenant": "x"})()
    tailer._in_flight, tailer._answered, tailer._handed = deque(), [], []
    tailer._committed, tailer.stats = {}, Counter()
    tailer._owned = {("t", 0)}
    tailer._in_revoke = tailer._commit_sync = tailer._no_more_commits = False
    tailer._stop = threading.Event()
    tailer._fault = type("F", (), {"reached": lambda self, where: None})()
    tailer._next, tailer._next_since = [], 0.0

    class Handoff:
        def resolve_messages(self, binding: Any, messages: list[_Msg],
                             outcomes: list[wire.Outcome],
                             origins: list[str] | None = None,
                             batch_bytes: int | None = None) -> Counter[str]:
            counts: Counter[str] = Counter(o["status"] for o in outcomes)
            if counts["retry"]:
                log.append(("produce", [m.o for m in messages]))
            return counts

        def confirm(self) -> None:
            log.append(("confirm",))

    class Consumer:
        def consume(self, n: int, wait: float) -> list[_Msg]:
            got, ready[:n] = ready[:n], []
            return got

        def poll(self, timeout: float) -> None:
            return None

        def commit(self, offsets: list[Any], asynchronous: bool) -> None:
            log.append(("commit", [o.offset for o in offsets]))

    tailer.handoff = Handoff()  # type: ignore[assignment]
    tailer._consumer = Consumer()  # type: ignore[assignment]

    def submit(messages: list[_Msg]) -> None:
        log.append(("submit", [m.o for m in messages]))
        batch = _Batch(messages, _Call(), {("t", 0): messages[-1].o})  # type: ignore[arg-type]
        tailer._in_flight.append(batch)

    tailer._submit = submit  # type: ignore[method-assign]
    return tailer


def test_the_next_batch_leaves_before_hand_offs_and_commits_wait_for_their_confirm() -> None:
    log: list[tuple[Any, ...]] = []
    tailer = _tailer(log, [_Msg(4), _Msg(5)])
    consumer = tailer._consumer
    # batch A (offsets 0, 1) answered: both failed; batch B (2, 3) still running
    failing = _Call([wire.retry(0, "boom"), wire.retry(1, "boom")])
    tailer._in_flight.append(_Batch([_Msg(0), _Msg(1)], failing, {("t", 0): 1}))  # type: ignore[arg-type]
    b_call = _Call()
    tailer._in_flight.append(_Batch([_Msg(2), _Msg(3)], b_call, {("t", 0): 3}))  # type: ignore[arg-type]
    for _ in range(3):
        tailer._step(consumer)  # type: ignore[arg-type]
    assert log == [("submit", [4, 5]), ("produce", [0, 1])]  # C left before A's hand-offs
    b_call.answer([wire.ok(0), wire.ok(1)])
    tailer._step(consumer)  # type: ignore[arg-type]
    # B is all ok, but A comes first: A's hand-offs confirmed, A committed, then B
    assert log[2:] == [("confirm",), ("commit", [2]), ("commit", [4])]


def test_an_all_ok_batch_is_committed_when_its_answer_comes() -> None:
    log: list[tuple[Any, ...]] = []
    tailer = _tailer(log, [])
    answered = _Call([wire.ok(0), wire.ok(1)])
    tailer._in_flight.append(_Batch([_Msg(0), _Msg(1)], answered, {("t", 0): 1}))  # type: ignore[arg-type]
    tailer._in_flight.append(_Batch([_Msg(2), _Msg(3)], _Call(), {("t", 0): 3}))  # type: ignore[arg-type]
    tailer._step(tailer._consumer)  # type: ignore[arg-type]
    assert log == [("commit", [2])]


def test_with_nothing_to_send_hand_offs_do_not_wait_for_the_call_under_way() -> None:
    """A slow call must not hold back the retries of the batch answered before it."""
    log: list[tuple[Any, ...]] = []
    tailer = _tailer(log, [])  # no more records to read
    failing = _Call([wire.retry(0, "boom"), wire.retry(1, "boom")])
    tailer._in_flight.append(_Batch([_Msg(0), _Msg(1)], failing, {("t", 0): 1}))  # type: ignore[arg-type]
    slow = _Call()  # never answered in this test
    tailer._in_flight.append(_Batch([_Msg(2), _Msg(3)], slow, {("t", 0): 3}))  # type: ignore[arg-type]
    for _ in range(3):
        tailer._step(tailer._consumer)  # type: ignore[arg-type]
    assert log == [("produce", [0, 1])]
    assert not slow.future.done()


def test_the_tailer_keeps_max_in_flight_batches_at_the_scheduler() -> None:
    """``asynctier run --max-in-flight N``: N batches leave before the tailer waits for the
    oldest answer."""
    for depth in (1, 3):
        log: list[tuple[Any, ...]] = []
        tailer = _tailer(log, [_Msg(o) for o in range(20)])
        tailer.options = TailerOptions(batch_size=2, max_in_flight=depth, linger_s=0.0)
        tailer._resolve_oldest = lambda log=log: log.append(("wait",))  # type: ignore
        for _ in range(20):
            tailer._step(tailer._consumer)  # type: ignore[arg-type]
            if log and log[-1] == ("wait",):
                break
        assert [entry[0] for entry in log] == ["submit"] * depth + ["wait"], depth
