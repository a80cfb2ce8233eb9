"""The run stream against a real in-process scheduler: the test plays the tailer.

Items are accepted at once (an ``alive`` naming them all), each outcome comes as its item
ends (quick ones before a slow one of the same call), ``alive`` beats while the slow one
runs, a checkpoint returns once the tailer answered ``saved`` (a refusal fails the
attempt), and an item sent with a checkpoint finds it in ``ctx.resumed``.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.context import MAX_CHECKPOINT_BYTES, Context, encode_checkpoint
from asynctier.platform.errors import CheckpointError
from asynctier.platform.stream import Event, Message, decode, encode, items_message
from asynctier.platform.wire import Outcome, decode_outcomes, encode_items
from tests.scheduler_harness import Running, item, running_scheduler

SYNC = Binding(name="long", source=Source("queue", "t"), function="tests.funcs.long:work",
               execution=Execution(timeout_s=30))
ASYNC = Binding(name="along", source=Source("queue", "t"), function="tests.funcs.long:awork",
                execution=Execution(timeout_s=30))
#: long work by its timeout (above queue_after_s): every item alone, however quick
MINUTES = Binding(name="minutes", source=Source("queue", "t", queue_after_s=60),
                  function="tests.funcs.long:awork", execution=Execution(timeout_s=120))


@pytest.fixture
def sched(settings: Settings) -> Iterator[Running]:
    with running_scheduler(settings, [SYNC, ASYNC, MINUTES],
                           allow=("tests.funcs.long",)) as running:
        yield running


class Tailer:
    """One run stream, seen from the tailer's side."""

    def __init__(self, sched: Running, payloads: list[dict[str, Any]], binding: str = "long",
                 resume: dict[int, tuple[str, bytes]] | None = None) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        request = encode_items([item(binding, n, json.dumps(p).encode())
                                for n, p in enumerate(payloads)])
        call = sched.client.open_stream(items_message(request, resume or {}, 0.1),
                                        list(payloads), self.events)
        assert call is not None
        self.call = call

    def next(self, timeout_s: float = 10.0) -> Message:
        """The next message (``end`` last)."""
        return self.events.get(timeout=timeout_s)[1]

    def run(self, answer: str = "", timeout_s: float = 20.0) -> list[tuple[float, Any]]:
        """Every message until the end, each checkpoint answered with ``answer`` (empty:
        saved); (when, what) per message: an outcome, ``alive`` ids or a checkpoint."""
        got: list[tuple[float, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.next(deadline - time.monotonic())
            if message.kind == "end":
                assert not message.error, message.error
                return got
            if message.kind == "outcomes":
                got += [(time.monotonic(), o) for o in decode_outcomes(message.body)]
            elif message.kind == "alive":
                got.append((time.monotonic(), ("alive", tuple(message.ids))))
            elif message.kind == "checkpoint":
                got.append((time.monotonic(), ("checkpoint", message.item,
                                               json.loads(message.state))))
                self.call.send(Message("saved", seq=message.seq, error=answer))
        raise AssertionError(f"the stream did not end within {timeout_s}s: {got}")


def outcomes(got: list[tuple[float, Any]]) -> dict[int, tuple[float, Outcome]]:
    """Each item's outcome, and when it came."""
    return {o["id"]: (at, o) for at, o in got if isinstance(o, dict)}


def marks(got: list[tuple[float, Any]], kind: str) -> list[tuple[float, tuple[Any, ...]]]:
    """The ``alive`` or ``checkpoint`` messages: (when, what came with it)."""
    return [(at, o[1:]) for at, o in got if isinstance(o, tuple) and o[0] == kind]


def test_quick_items_are_answered_as_they_end_beside_a_slow_one(sched: Running) -> None:
    started = time.monotonic()
    tailer = Tailer(sched, [{"sleep": 1.5, "checkpoints": 2}] + [{}] * 5)
    got = tailer.run()
    assert got[0][1] == ("alive", (0, 1, 2, 3, 4, 5)), got[:3]  # accepted at once
    done = outcomes(got)
    assert set(done) == set(range(6)) and all(o["status"] == "ok" for _, o in done.values())
    assert all(done[i][0] - started < 1.0 for i in range(1, 6)), done
    assert done[0][0] - started >= 1.5
    beats = [at for at, ids in marks(got, "alive") if ids == ((0,),) and at < done[0][0]]
    assert len(beats) >= 5, got  # 0.1 s beats while only the slow item ran
    assert [what for _, what in marks(got, "checkpoint")] == [(0, {"step": 1}),
                                                              (0, {"step": 2})]


def test_quick_items_once_measured_come_back_in_chunks(sched: Running) -> None:
    """A binding not measured yet runs one item per chunk (it may be long work); once its
    items are measured quick, a stream's items run in chunks again, their outcomes a
    message per chunk: one chunk per item cost the queue drain tenfold. A binding whose
    timeout is above its queue-after threshold keeps one item per chunk."""
    def outcome_messages(count: int, binding: str = "along") -> int:
        tailer = Tailer(sched, [{}] * count, binding=binding)
        messages, ids = 0, set()
        while (message := tailer.next()).kind != "end":
            if message.kind == "outcomes":
                messages += 1
                ids |= {o["id"] for o in decode_outcomes(message.body)}
        assert ids == set(range(count)), message.error
        return messages

    assert outcome_messages(40) == 40  # not measured: each its own chunk
    assert outcome_messages(200) <= 200 // 8  # measured quick: chunks of 8 or more
    assert outcome_messages(40, "minutes") == 40
    assert outcome_messages(100, "minutes") == 100  # measured quick, still each alone


def test_a_refused_checkpoint_fails_the_attempt_saying_why(sched: Running) -> None:
    got = Tailer(sched, [{"checkpoints": 1}]).run(answer="this item's lease ran out")
    [(_, outcome)] = outcomes(got).values()
    assert outcome["status"] == "retry" and "lease ran out" in (outcome["error"] or "")


def test_an_item_sent_with_its_checkpoint_resumes_from_it(sched: Running) -> None:
    got = Tailer(sched, [{"show_resumed": True}, {"show_resumed": True}],
                 resume={0: ("json", b'{"step": 3}')}).run()
    done = outcomes(got)
    assert done[0][1]["error"] == "resumed={'step': 3}"
    assert done[1][1]["error"] == "resumed=None"


def test_an_async_function_awaits_its_checkpoint(sched: Running) -> None:
    got = Tailer(sched, [{"state": [1, "two"]}], binding="along").run()
    assert [what for _, what in marks(got, "checkpoint")] == [(0, [1, "two"])]
    [(_, outcome)] = outcomes(got).values()
    assert outcome["status"] == "ok", outcome


def test_checkpoints_are_small_json_or_bytes_and_need_a_queue_binding() -> None:
    assert encode_checkpoint("b", b"\x00raw") == (b"\x00raw", "bytes")
    assert encode_checkpoint("b", {"page": 7}) == (b'{"page":7}', "json")
    with pytest.raises(CheckpointError, match="not JSON-able"):
        encode_checkpoint("b", {"when": object()})
    with pytest.raises(CheckpointError, match="over the 65,536-byte limit"):
        encode_checkpoint("b", b"x" * (MAX_CHECKPOINT_BYTES + 1))
    ctx = Context("orders", None, (), "orders/0/1", 1, 0.0, 0.0)
    assert ctx.resumed is None
    with pytest.raises(CheckpointError, match="bind the function with --queue"):
        ctx.checkpoint({"page": 1})


def test_stream_messages_round_trip() -> None:
    message = Message("items", body=b"req", resume={3: ("json", b"{}")}, heartbeat_ms=250)
    assert decode(encode(message)) == message
    alive = Message("alive", ids=[1, 2, 2**40])
    assert decode(encode(alive)).ids == [1, 2, 2**40]


def test_a_reader_that_fails_is_logged_and_the_outcomes_still_come(
        caplog: pytest.LogCaptureFixture) -> None:
    """The tailer's side of the stream breaks after its first message: the session's
    reader task fails, says so in the log, and the work's outcomes are still sent."""
    import asyncio
    from collections.abc import AsyncIterator

    from asynctier.platform.wire import ok
    from asynctier.scheduler.streaming import RunSession

    class Quick:  # the scheduler's one method a session calls
        async def process(self, items: list[Any], report: Any) -> list[Outcome]:
            await asyncio.sleep(0.05)
            return [ok(i["id"]) for i in items]

    async def requests() -> AsyncIterator[bytes]:
        yield items_message(encode_items([item("long", 1)]), {}, 0.1)
        raise ConnectionResetError("the tailer went away")

    async def scenario() -> list[Message]:
        session = RunSession(Quick())  # type: ignore[arg-type]
        return [decode(m) async for m in session.serve(requests())]

    sent = asyncio.run(scenario())
    outcomes = [o for m in sent if m.kind == "outcomes" for o in decode_outcomes(m.body)]
    assert [(o["id"], o["status"]) for o in outcomes] == [(1, "ok")]
    assert "a run stream's reader of checkpoint answers" in caplog.text
    assert "the tailer went away" in caplog.text
