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
from asynctier.platform.errors import DecodeError
from asynctier.platform.scheduler.payloads import TOMBSTONE, decode_json, decoder_for

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "n", "type": "long"}, {"name": "s", "type": "string"}]})
AVRO = Binding("b", "t", "m:f", format="avro", schema=SCHEMA)


def encode(doc: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, AVRO.parsed_schema(), doc)
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
    decode = decoder_for(Binding("b", "t", "m:f", format="bytes"))
    assert decode(b"\x00\xff") == b"\x00\xff"
    assert decode(None) is None


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    for decode in (decoder_for(AVRO), decode_json):
        with contextlib.suppress(DecodeError):
            decode(data)
