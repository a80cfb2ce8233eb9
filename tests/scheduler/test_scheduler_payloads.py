"""Payload decoding by format: json, avro (all bytes used), bytes; tombstones."""

from __future__ import annotations

import contextlib
import io
import json

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Payload, Source
from asynctier.platform.errors import DecodeError
from asynctier.platform.payloads import TOMBSTONE, decode_json, decoder_for

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "n", "type": "long"}, {"name": "s", "type": "string"}]})
AVRO = Binding("b", Source("kafka", "t"), "m:f", payload=Payload(format="avro", schema=SCHEMA))


def encode(doc: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, AVRO.payload.parsed_schema(), doc)
    return buf.getvalue()


def test_json() -> None:
    assert decode_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    for bad in (b"{", b"\xff", b"", b"nul"):
        with pytest.raises(DecodeError, match="json"):
            decode_json(bad)
    with pytest.raises(DecodeError, match="not UTF-8"):
        decode_json('"é"'.encode("utf-16"))
    with pytest.raises(DecodeError, match=TOMBSTONE):
        decode_json(None)


def test_avro_uses_every_byte() -> None:
    decode = decoder_for(AVRO)
    assert decode(encode({"n": 5, "s": "x"})) == {"n": 5, "s": "x"}
    with pytest.raises(DecodeError, match="1 byte"):
        decode(encode({"n": 5, "s": "x"}) + b"\x00")
    with pytest.raises(DecodeError, match="avro"):
        decode(b"\x02\x10")
    with pytest.raises(DecodeError, match=TOMBSTONE):
        decode(None)


def test_bytes_are_passed_as_they_are() -> None:
    decode = decoder_for(Binding("b", Source("kafka", "t"), "m:f", payload=Payload(format="bytes")))
    assert decode(b"\x00\xff") == b"\x00\xff"
    assert decode(None) is None


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    for decode in (decoder_for(AVRO), decode_json):
        with contextlib.suppress(DecodeError):
            decode(data)


def _same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True do not count)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (a != a and b != b) or (a == b and str(a) == str(b))  # nan; -0.0 vs 0.0
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=())),  # lone surrogates too
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=5), inner, max_size=5),
    max_leaves=20)


@given(_JSON, st.booleans())
def test_json_reads_what_json_loads_reads(doc: object, ascii_only: bool) -> None:
    """The fast path gives exactly what ``json.loads`` gives: big integers stay integers,
    NaN, Infinity and lone surrogates still come through."""
    data = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    expected: object
    try:
        expected = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        with pytest.raises(DecodeError, match="not UTF-8"):
            decode_json(data)
        return
    assert _same(decode_json(data), expected)


@given(st.binary(max_size=40) | st.sampled_from(
    [b"1e400", b"-Infinity", b'{"a":1,"a":2}', b"123456789012345678901234567890",
     b'"\\ud800"', b"\xef\xbb\xbf{}", b"[1,2,]", b" 7 "]))
def test_json_errors_are_the_standard_modules(data: bytes) -> None:
    """Any bytes: the same document as ``json.loads``, or a DecodeError with its words."""
    try:
        expected = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        with pytest.raises(DecodeError, match=f"not UTF-8 \\({exc.reason}"):
            decode_json(data)
    except ValueError as exc:
        with pytest.raises(DecodeError) as got:
            decode_json(data)
        assert str(got.value) == f"json: {exc}"
    else:
        assert _same(decode_json(data), expected)
