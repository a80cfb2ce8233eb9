"""The order of a tailer's work when a batch has records to hand off (pure logic: the
tailer is built through its constructor with a recording consumer, a Handoff on a
recording producer, and a scheduler client whose calls the test answers).

The next batch leaves for the scheduler before the answered batch's hand-offs are produced
(they are produced while that call runs), and offsets are committed only after the
hand-offs they cover are confirmed, oldest batch first. A batch that is all ``ok`` is
committed at once, and with nothing to send the hand-offs do not wait for the call under
way. The real hand-offs are exercised by tests/faults and the delay tests."""

from __future__ import annotations

from typing import Any

from asynctier.delay_streams.handoff import Handoff
from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.tailers.kafka import KafkaTailer
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Pipeline
from tests.funcs.recording import (
    Log,
    RecordingClient,
    RecordingConsumer,
    RecordingProducer,
    message,
    parts,
)

SETTINGS = Settings(kafka={"bootstrap.servers": "127.0.0.1:9", "log_level": "0"})


def _tailer(log: Log, offsets: range, max_in_flight: int = 2,
            ) -> tuple[KafkaTailer, Pipeline, RecordingConsumer, RecordingClient]:
    """A tailer of topic ``t`` (partition 0 assigned) whose consumer holds ``offsets``."""
    consumer = RecordingConsumer(ready=[message(0, o) for o in offsets])
    client = RecordingClient(log)
    tailer = KafkaTailer(SETTINGS, Binding("orders", Source("kafka", "t"),
                                           "tests.funcs.ledger:record"),
                         client,  # type: ignore[arg-type]
                         TailerOptions(batch_size=2, max_in_flight=max_in_flight,
                                       linger_s=0.0, idle_poll_s=0.0,
                                       max_poll_interval_ms=400),
                         consumer_factory=lambda conf: consumer,
                         handoff=Handoff(SETTINGS, RecordingProducer(log)))  # type: ignore[arg-type]
    pipeline = tailer.open()
    consumer.assign(parts("t", 0))
    consumer.log = log  # what the consumer is asked from now on (commits)
    return tailer, pipeline, consumer, client


def _two_batches_under_way(log: Log, ready_after: range) -> tuple[Pipeline, RecordingClient]:
    """Batches A (offsets 0, 1) and B (2, 3) at the scheduler; ``ready_after`` to read."""
    _, pipeline, consumer, client = _tailer(log, range(4))
    for _ in range(3):
        pipeline.step()
    assert [len(c.items) for c in client.calls] == [2, 2] and len(pipeline.in_flight) == 2
    consumer.ready += [message(0, o) for o in ready_after]
    log.clear()
    return pipeline, client


def _produced(*offsets: int) -> list[tuple[Any, ...]]:
    """The delay records of ``offsets`` (to the ladder's first step, 30 s)."""
    return [("produce", SETTINGS.names.delay_topic("30s"), f"t/0/{o}") for o in offsets]


def test_the_next_batch_leaves_before_hand_offs_and_commits_wait_for_their_confirm() -> None:
    log: Log = []
    pipeline, client = _two_batches_under_way(log, range(4, 6))
    a, b = client.calls
    a.answer([wire.retry(0, "boom"), wire.retry(1, "boom")])  # A answered: both failed
    for _ in range(3):
        pipeline.step()
    # C left before A's hand-offs
    assert log == [("submit", [4, 5]), *_produced(0, 1)]
    b.ok()
    pipeline.step()
    # B is all ok, but A comes first: A's hand-offs confirmed, A committed, then B
    assert log[3:] == [("confirm",), ("commit", [2]), ("commit", [4])]


def test_an_all_ok_batch_is_committed_when_its_answer_comes() -> None:
    log: Log = []
    pipeline, client = _two_batches_under_way(log, range(0))
    client.calls[0].ok()
    pipeline.step()
    assert log == [("commit", [2])]


def test_with_nothing_to_send_hand_offs_do_not_wait_for_the_call_under_way() -> None:
    """A slow call must not hold back the retries of the batch answered before it."""
    log: Log = []
    pipeline, client = _two_batches_under_way(log, range(0))  # no more records to read
    failing, slow = client.calls
    failing.answer([wire.retry(0, "boom"), wire.retry(1, "boom")])
    for _ in range(3):
        pipeline.step()
    assert log == _produced(0, 1)
    assert not slow.future.done()  # never answered in this test


def test_the_tailer_keeps_max_in_flight_batches_at_the_scheduler() -> None:
    """``asynctier run --max-in-flight N``: N batches leave before the tailer waits for the
    oldest answer (it pauses its partitions and polls while it waits; the stand-in
    scheduler answers then)."""
    for depth in (1, 3):
        log: Log = []
        _, pipeline, consumer, client = _tailer(log, range(20), max_in_flight=depth)

        def waiting(log: Log = log, client: RecordingClient = client) -> None:
            log.append(("wait",))
            client.calls[0].ok()

        consumer.on_pause = waiting
        for _ in range(20):
            pipeline.step()
            if ("wait",) in log:
                break
        assert [e[0] for e in log if e[0] in ("submit", "wait")] == (
            ["submit"] * depth + ["wait"]), depth
