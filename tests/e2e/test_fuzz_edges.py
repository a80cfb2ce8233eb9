"""Fuzzing at the edges: whatever bytes reach the scheduler's Submit and run-stream methods
and the Submitter's SubmitWorkloads, every call ends with a gRPC status, the process keeps
serving, and a well-formed call after the storm succeeds.

Frames are hypothesis-made: random bytes, well-formed requests cut short, requests whose
fields are well-formed but hostile (counts that lie, ids repeated or negative, attempts,
priorities, deadlines and delays at their extremes, platform headers, checkpoints that do
not decode), and frames over the size a call may carry. One server per module and one
channel; each call has a deadline, and running out of it is a failure (a hang).
"""

from __future__ import annotations

import asyncio
import io
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fastavro
import grpc
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from asynctier.platform import stream, wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Payload, Source
from asynctier.platform.binding_source import StaticBindings
from asynctier.platform.config import Settings
from asynctier.platform.replies import read_outcomes
from asynctier.platform.rpc import MAX_MESSAGE, SUBMIT
from asynctier.platform.schemas import load_schema
from asynctier.submitter import protocol
from asynctier.submitter.server import serve_submitter
from asynctier.submitter.service import SubmitterOptions
from tests.scheduler_harness import running_scheduler

EXAMPLES = 2000
CALL_TIMEOUT_S = 10.0
#: The statuses that mean the server did not answer: a hang, or a server gone.
NO_ANSWER = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
FUZZ = hsettings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
NAMES = st.sampled_from(["fz", "fzb", "nope", "", "asynctier.attempt"])
HEADER_NAMES = st.sampled_from(["asynctier.attempt", "asynctier.origin", "asynctier.due",
                                "asynctier.first-seen", "asynctier.delay", "trace", ""])


def _settings(kafka_bootstrap: str, redis_url: str) -> Settings:
    return Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                    prefix="t" + uuid.uuid4().hex[:10])


# -- frames --------------------------------------------------------------------------------

def _packed(code: str, values: st.SearchStrategy[int] | st.SearchStrategy[float],
            ) -> st.SearchStrategy[bytes]:
    """A packed column: sometimes of the right kind, sometimes any bytes."""
    return st.one_of(st.lists(values, max_size=6).map(
        lambda v: wire._pack(code, v)), st.binary(max_size=24))


@st.composite
def _hostile_request(draw: st.DrawFn) -> bytes:
    """A submit request that decodes as Avro, its values anything the schema allows."""
    count = draw(st.one_of(st.integers(0, 6), INT64))
    doc = {
        "count": count,
        "bindings": draw(st.lists(NAMES, max_size=3)),
        "binding_of": draw(_packed("i", st.integers(-2, 3))),
        "ids": draw(_packed("q", st.one_of(st.integers(-2, 6), INT64))),
        "attempt": draw(INT32),
        "attempts": draw(_packed("i", INT32)),
        "payloads": draw(st.binary(max_size=40)),
        "payload_lens": draw(_packed("i", st.integers(-2, 12))),
        "keys": draw(st.binary(max_size=10)),
        "key_lens": draw(_packed("i", st.integers(-2, 6))),
        "source_refs": draw(st.text(max_size=30)),
        "record_times_ms": draw(_packed("q", INT64)),
        "headers": draw(st.lists(st.fixed_dictionaries({
            "item": st.integers(-3, 8), "name": HEADER_NAMES,
            "value": st.one_of(st.none(), st.binary(max_size=12))}), max_size=4)),
        "priorities": draw(_packed("i", INT32)),
        "deadlines_ms": draw(_packed("q", INT64)),
        "fresh": draw(st.binary(max_size=8)),
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("submit"), doc)
    return buf.getvalue()


@st.composite
def _sound_request(draw: st.DrawFn) -> bytes:
    """A submit request the tailer could send, with hostile values in every field."""
    cols = wire.Columns()
    for _ in range(draw(st.integers(0, 5))):
        cols.add(draw(NAMES), draw(st.one_of(st.none(), st.binary(max_size=30),
                                             st.just(b'{"n": 1}'))),
                 draw(st.one_of(st.none(), st.binary(max_size=8))),
                 draw(st.lists(st.tuples(HEADER_NAMES, st.one_of(st.none(),
                                                                 st.binary(max_size=12))),
                               max_size=3)),
                 draw(INT32), draw(st.text(max_size=20).map(lambda t: t.replace("\n", ""))),
                 draw(INT64), draw(INT32), draw(st.one_of(st.none(), INT64)),
                 draw(st.booleans()))
    ids = draw(st.one_of(st.none(), st.lists(st.integers(-2, 6), min_size=len(cols),
                                             max_size=len(cols))))
    return cols.encode(ids)


def _cut(frame: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """A frame cut short (or with its tail replaced by noise)."""
    return st.tuples(frame, st.integers(0, 200), st.binary(max_size=8)).map(
        lambda t: t[0][:t[1]] + t[2])


REQUESTS = st.one_of(st.binary(max_size=300), _hostile_request(), _sound_request(),
                     _cut(_sound_request()))


@st.composite
def _stream_frames(draw: st.DrawFn) -> list[bytes]:
    """What a tailer (or anyone) sends on a run stream: an items message or noise first,
    then answers to checkpoints or noise."""
    body = draw(REQUESTS)
    first = draw(st.one_of(
        st.binary(max_size=200),
        st.builds(lambda resume, beat: stream.encode(stream.Message(
            "items", body=body, resume=resume, heartbeat_ms=beat)),
            st.dictionaries(st.integers(-2, 6), st.tuples(
                st.sampled_from(["bytes", "json", "pickle", ""]), st.binary(max_size=20)),
                max_size=2),
            INT64),
        st.builds(lambda kind: stream.encode(stream.Message(kind, body=body)),
                  st.sampled_from(["outcomes", "alive", "checkpoint", "saved"])),
    ))
    rest = draw(st.lists(st.one_of(
        st.binary(max_size=60),
        st.builds(lambda seq, error: stream.encode(stream.Message("saved", seq=seq,
                                                                  error=error)),
                  INT64, st.text(max_size=10))), max_size=2))
    return [draw(_cut(st.just(first))) if draw(st.booleans()) else first, *rest]


def _status(call: Callable[[], Any]) -> grpc.StatusCode:
    """The status a call ended with."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# -- the scheduler -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scheduler(kafka_bootstrap: str, redis_url: str) -> Iterator[tuple[str, grpc.Channel]]:
    bindings = [Binding("fz", Source("kafka", "fz"), "tests.funcs.basic:noop",
                        execution=Execution(timeout_s=5.0)),
                Binding("fzb", Source("kafka", "fzb"), "tests.funcs.basic:noop",
                        payload=Payload(format="bytes"), execution=Execution(timeout_s=5.0))]
    with running_scheduler(_settings(kafka_bootstrap, redis_url), bindings) as sched, \
            grpc.insecure_channel(sched.address, options=[
                ("grpc.max_send_message_length", 2 * MAX_MESSAGE)]) as channel:
        yield sched.address, channel


def _well_formed_submit(channel: grpc.Channel) -> None:
    submit = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
    cols = wire.Columns()
    for n in range(3):
        cols.add("fz", b'{"n": %d}' % n, None, None, 1, f"fz/0/{n}", 0)
    outcomes = read_outcomes(submit(cols.encode(), timeout=CALL_TIMEOUT_S), range(3))
    assert [o["status"] for o in outcomes] == ["ok"] * 3


def _storm(submit: Callable[..., Any], frames: st.SearchStrategy[bytes]) -> None:
    """Send :data:`EXAMPLES` hypothesis-made frames, then one over the size limit: each
    call gets a status before its deadline (none goes unanswered)."""
    seen: list[grpc.StatusCode] = []

    @FUZZ
    @given(frames)
    def storm(frame: bytes) -> None:
        code = _status(lambda: submit(frame, timeout=CALL_TIMEOUT_S))
        assert code not in NO_ANSWER, f"{len(frame)}-byte frame: {code}"
        seen.append(code)

    storm()
    over = b"\x00" * (MAX_MESSAGE + 1)
    assert _status(lambda: submit(over, timeout=CALL_TIMEOUT_S)) \
        == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(seen) >= EXAMPLES


def test_the_submit_rpc_answers_every_frame_with_a_status(
        scheduler: tuple[str, grpc.Channel]) -> None:
    _, channel = scheduler
    submit = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
    _storm(submit, REQUESTS)
    _well_formed_submit(channel)


def test_the_run_stream_answers_every_frame_with_a_status(
        scheduler: tuple[str, grpc.Channel]) -> None:
    _, channel = scheduler
    run = channel.stream_stream(stream.RUN_STREAM, request_serializer=None,
                                response_deserializer=None)
    seen: list[grpc.StatusCode] = []

    @FUZZ
    @given(_stream_frames())
    def storm(frames: list[bytes]) -> None:
        code = _status(lambda: list(run(iter(frames), timeout=CALL_TIMEOUT_S)))
        assert code not in NO_ANSWER, f"frames of {[len(f) for f in frames]} bytes: {code}"
        seen.append(code)

    storm()
    assert len(seen) >= EXAMPLES
    cols = wire.Columns()
    for n in range(3):
        cols.add("fz", b'{"n": %d}' % n, None, None, 1, f"fz/0/{n}", 0)
    answers = [stream.decode(m) for m in run(
        iter([stream.items_message(cols.encode(), {}, 1.0)]), timeout=CALL_TIMEOUT_S)]
    ended = [o for m in answers if m.kind == "outcomes"
             for o in read_outcomes(m.body, range(3), whole=False)]
    assert sorted((o["id"], o["status"]) for o in ended) == [(n, "ok") for n in range(3)]
    _well_formed_submit(channel)


# -- the Submitter -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def submitter(kafka_bootstrap: str, redis_url: str,
              postgres: str) -> Iterator[grpc.Channel]:
    settings = _settings(kafka_bootstrap, redis_url).with_overrides(queue_shards=(postgres,))
    tenant = settings.prefix
    bindings = [Binding("q", Source("queue", "fuzz"), "tests.faults.funcs:run", tenant=tenant),
                Binding("qb", Source("queue", "fuzzb"), "tests.faults.funcs:run", tenant=tenant,
                        payload=Payload(format="bytes", max_bytes=64))]
    stop, ready = threading.Event(), threading.Event()
    address: list[str] = []

    def on_ready(where: str) -> None:
        address.append(where.replace("localhost", "127.0.0.1"))
        ready.set()

    thread = threading.Thread(target=lambda: asyncio.run(serve_submitter(
        settings, listen="127.0.0.1:0", stop=stop, options=SubmitterOptions(max_backlog=None),
        ready_callback=on_ready, bindings=StaticBindings(bindings), stop_grace_s=5.0)),
        daemon=True)
    thread.start()
    assert ready.wait(60), "the Submitter did not start"
    try:
        with grpc.insecure_channel(address[0], options=[
                ("grpc.max_send_message_length", 2 * MAX_MESSAGE)]) as channel:
            yield channel
    finally:
        stop.set()
        thread.join(30)


_workload = st.builds(
    protocol.Workload,
    st.one_of(st.none(), st.binary(max_size=80), st.just(b'{"n": 1}')),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.lists(st.tuples(HEADER_NAMES, st.one_of(st.none(), st.binary(max_size=8))),
             max_size=2).map(tuple),
    st.one_of(st.none(), st.integers(-2000, 2000), INT64),
    st.one_of(st.none(), st.integers(-10, 10**12), INT64),
    st.one_of(st.none(), st.text(max_size=12), st.text(min_size=200, max_size=210)),
    # parents: unknown ids, bad ids, bad topics; the enum's two symbols (anything else is
    # not on the wire: the raw and cut frames above reach the rest)
    st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(["work", "bad topic", ""])),
                       st.one_of(st.text(max_size=12), st.just("a\nb"))),
             max_size=2).map(tuple),
    st.one_of(st.none(), st.sampled_from(["fail", "run"])))
CALLS = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda binding, loads, whole: protocol.encode_call(
        protocol.Call(binding, loads, whole)),
        st.sampled_from(["q", "qb", "nope", ""]), st.lists(_workload, max_size=4),
        st.booleans()),
)


def test_the_submitter_answers_every_frame_with_a_status(submitter: grpc.Channel) -> None:
    submit = submitter.unary_unary(protocol.METHOD, request_serializer=None,
                                   response_deserializer=None)
    _storm(submit, st.one_of(CALLS, _cut(CALLS)))
    results = protocol.decode_results(submit(protocol.encode_call(protocol.Call(
        "q", [protocol.Workload(b'{"n": %d}' % n) for n in range(3)])),
        timeout=CALL_TIMEOUT_S))
    assert [r.status for r in results] == ["accepted"] * 3
