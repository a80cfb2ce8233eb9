"""The Submitter's pieces that need no service: config, the CLI's plumbing, the wire, the
SDK's payloads."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.cli.bindings import _size
from asynctier.cli.run import COMPONENTS, _child_args
from asynctier.client import as_payload
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import BindingError
from asynctier.platform.schemas import load_schema
from asynctier.submitter.protocol import (
    METHOD,
    Call,
    Result,
    Workload,
    decode_call,
    decode_results,
    encode_call,
    encode_results,
)
from asynctier.tailers.options import TailerOptions


def test_the_submitters_come_from_the_file_and_the_environment() -> None:
    doc = {"asynctier": {"submitter_listen": "0.0.0.0:7000", "submitters": ["a:1", "b:2"]}}
    settings = Settings.from_mapping(doc)
    assert (settings.submitter_listen, settings.submitters) == ("0.0.0.0:7000", ("a:1", "b:2"))
    env = {"ASYNCTIER_SUBMITTERS": "c:3,d:4", "ASYNCTIER_SUBMITTER_LISTEN": "127.0.0.1:9"}
    assert settings.from_env(env).submitters == ("c:3", "d:4")
    assert settings.from_env(env).submitter_listen == "127.0.0.1:9"


def test_a_plain_run_starts_a_submitter_with_its_listen_address() -> None:
    assert "submitter" in COMPONENTS
    args = _child_args("submitter", (), None, None, TailerOptions(), "127.0.0.1:7001")
    assert args[args.index("--submitter-listen") + 1] == "127.0.0.1:7001"
    assert "--submitter-listen" not in _child_args("tailers", (), None, None, TailerOptions(),
                                                   "127.0.0.1:7001")


def test_a_call_and_its_results_survive_the_wire() -> None:
    call = Call("b", [Workload(b"{}", b"k", (("h", b"v"), ("n", None)), 5, 1500, "x"),
                      Workload(None, after=((None, "p"), ("encodes", "q")),
                               on_parent_failure="run")], all_or_nothing=True)
    assert decode_call(encode_call(call)) == call
    results = [Result("accepted", 0, "x", "t", 2, 40), Result("throttled", 1, reason="r",
                                                              retry_after_ms=900)]
    assert decode_results(encode_results(results)) == results
    assert METHOD.startswith("/asynctier.Submitter/SubmitWorkloadsV")


def test_the_sdk_sends_bytes_as_they_are_text_as_utf8_and_the_rest_as_json() -> None:
    assert as_payload(b"\x00\x01") == b"\x00\x01"
    assert as_payload("héllo") == "héllo".encode()
    assert as_payload({"id": 1, "x": [1, 2]}) == b'{"id":1,"x":[1,2]}'


def test_a_per_binding_payload_limit_is_parsed_checked_and_stored() -> None:
    """``bind --max-payload`` sizes parse with their units, out-of-range limits are refused
    naming the field, and the limit survives the bindings topic's Avro."""
    assert [_size("max payload", t) for t in ("4096", "512KB", "1MiB", "2 kib")] == [
        4096, 512_000, 1024 * 1024, 2048]
    with pytest.raises(BindingError, match="max payload: '1GB' is not a size"):
        _size("max payload", "1GB")
    base = Binding("small", Source("queue", "work"), "tests.faults.funcs:run")
    with pytest.raises(BindingError, match="max payload: max payload 2,097,152 bytes"):
        base.with_changes(payload=replace(base.payload, max_bytes=2 * 1024 * 1024)).validate()
    kept = base.with_changes(payload=replace(base.payload, max_bytes=512_000)).validate()
    assert Binding.decode(kept.encode()).payload.max_bytes == 512_000
    assert Binding.decode(base.encode()).payload.max_bytes is None


def fastavro_results(results: list[Result]) -> bytes:
    """What fastavro writes for ``results``: the reference of the hand-written encoder."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("workload_results"), {"results": [
        {"status": r.status, "id": r.id, "topic": r.topic, "partition": r.partition,
         "offset": r.offset, "reason": r.reason, "retry_after_ms": r.retry_after_ms}
        for r in results]})
    return buf.getvalue()


_text = st.none() | st.text(max_size=300)
_result = st.builds(
    Result, st.sampled_from(["accepted", "duplicate", "invalid", "throttled"]),
    id=_text, topic=st.none() | st.sampled_from(["work", "wörk", "t" * 200]),
    partition=st.none() | st.integers(-(2**31), 2**31 - 1),
    offset=st.none() | st.integers(-(2**63), 2**63 - 1), reason=_text,
    retry_after_ms=st.none() | st.integers(-(2**63), 2**63 - 1))


@given(st.lists(_result, max_size=40))
@settings(max_examples=100, deadline=None)
def test_the_reply_is_written_byte_for_byte_as_fastavro_writes_it(
        results: list[Result]) -> None:
    data = encode_results(results)
    assert data == fastavro_results(results)
    assert [(r.status, r.id, r.topic, r.partition, r.offset, r.reason, r.retry_after_ms)
            for r in decode_results(data)] == [
        (r.status, r.id, r.topic, r.partition, r.offset, r.reason, r.retry_after_ms)
        for r in results]


def fastavro_call(call: Call) -> bytes:
    """What fastavro writes for ``call``: the reference of the hand-written codec."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("workloads"), {
        "binding": call.binding, "all_or_nothing": call.all_or_nothing,
        "workloads": [{"payload": w.payload, "key": w.key,
                       "headers": [{"name": n, "value": v} for n, v in w.headers],
                       "priority": w.priority, "delay_ms": w.delay_ms, "id": w.id,
                       "after": [{"topic": t, "id": i} for t, i in w.after],
                       "on_parent_failure": w.on_parent_failure}
                      for w in call.workloads]})
    return buf.getvalue()


_bytes = st.none() | st.binary(max_size=300)
_long = st.none() | st.integers(-(2**63), 2**63 - 1)
_workload = st.builds(
    Workload, _bytes, _bytes,
    st.lists(st.tuples(st.text(max_size=40), _bytes), max_size=3).map(tuple),
    _long, _long, _text,
    st.lists(st.tuples(st.none() | st.text(max_size=40), st.text(max_size=40)),
             max_size=3).map(tuple),
    st.sampled_from([None, "fail", "run"]))
_call = st.builds(Call, st.text(max_size=60), st.lists(_workload, max_size=30),
                  st.booleans())


@given(_call)
@settings(max_examples=60, deadline=None)
def test_the_call_is_written_and_read_byte_for_byte_as_fastavro_does(call: Call) -> None:
    data = fastavro_call(call)
    assert encode_call(call) == data
    assert decode_call(data) == call
    assert decode_call(data).workloads == list(call.workloads)


@given(_call, st.data())
@settings(max_examples=40, deadline=None)
def test_a_cut_or_garbled_call_is_refused_with_a_value_error(call: Call,
                                                            data: st.DataObject) -> None:
    """Truncated, padded or garbled bytes never decode to a call quietly (or crash): a
    ValueError, which the Submitter answers INVALID_ARGUMENT."""
    good = encode_call(call)
    cut = data.draw(st.integers(0, len(good) - 1))
    with pytest.raises(ValueError, match="not a SubmitWorkloads call"):
        decode_call(good[:cut])
    with pytest.raises(ValueError, match="after the call's end"):
        decode_call(good + b"\x00")
    at = data.draw(st.integers(0, len(good) - 1))
    garbled = good[:at] + bytes([good[at] ^ data.draw(st.integers(1, 255))]) + good[at + 1:]
    with contextlib.suppress(ValueError):  # a call, or a ValueError: nothing else
        assert isinstance(decode_call(garbled), Call)


def test_a_call_in_blocks_of_negative_counts_is_read_too() -> None:
    """Avro lets a writer give a block's count negative, followed by its size in bytes."""
    one = Workload(b"p", id="a")
    whole = encode_call(Call("b", [one, one]))
    head = encode_call(Call("b", []))[:-1]  # the binding and the flag
    body = whole[len(head) + 1:-1]  # the two workloads, after their count
    size = len(body) // 2
    blocks = head + b"\x01" + bytes([size * 2]) + body[:size] + b"\x01" + bytes(
        [size * 2]) + body[size:] + b"\x00"
    assert decode_call(blocks) == Call("b", [one, one])


@given(st.lists(_result, max_size=40))
@settings(max_examples=40, deadline=None)
def test_the_reply_is_read_as_fastavro_reads_it(results: list[Result]) -> None:
    data = fastavro_results(results)
    expected = fastavro.schemaless_reader(io.BytesIO(data), load_schema("workload_results"),
                                          None)["results"]  # type: ignore[call-overload,index]
    assert [r._asdict() for r in decode_results(data)] == [
        {"position": i, **r} for i, r in enumerate(expected)]
    assert decode_results(data) == [r._replace(position=i) for i, r in enumerate(results)]
