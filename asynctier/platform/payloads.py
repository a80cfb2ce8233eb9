"""Decoding an item's payload by its binding's format: ``json``, ``avro``, ``bytes``, or
registry-framed ``avro`` / ``jsonschema`` / ``protobuf`` (:mod:`asynctier.platform.framed`).

Records are data: nothing here unpickles or evaluates anything. A payload that does not
decode raises :class:`DecodeError`; the runtime turns it into ``failed("undecodable: ...")``
so the tailer dead-letters the record at once.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import fastavro
import msgspec

from asynctier.platform.binding import Binding
from asynctier.platform.errors import DecodeError
from asynctier.platform.framed import RegistryClients, framed_decoder

TOMBSTONE = "tombstone: the record has no value"

Decoder = Callable[[bytes | None], Any]


_fast_json = msgspec.json.Decoder().decode


def decode_json(data: bytes | None) -> Any:
    """A JSON document from UTF-8 bytes, as ``json.loads`` reads it.

    msgspec's parser is several times faster than the standard module's. It refuses what
    the standard module lets through (NaN, Infinity, 1e400, lone surrogates): those
    documents, and every bad one, go to ``json.loads``, which decides and words the error.
    A property test holds the two paths equal."""
    if data is None:
        raise DecodeError(TOMBSTONE)
    try:
        return _fast_json(data)
    except msgspec.DecodeError:
        pass
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DecodeError(f"json: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except ValueError as exc:
        raise DecodeError(f"json: {exc}") from exc


def decode_bytes(data: bytes | None) -> bytes | None:
    """The bytes as they are (None for a tombstone)."""
    return data


def avro_decoder(schema: Any) -> Decoder:
    """A decoder of schemaless Avro with ``schema`` (parsed) that must use every byte."""

    def decode(data: bytes | None) -> Any:
        if data is None:
            raise DecodeError(TOMBSTONE)
        buf = io.BytesIO(data)
        try:
            value = fastavro.schemaless_reader(buf, schema, None)
        except Exception as exc:  # fastavro raises many kinds on garbage
            raise DecodeError(f"avro: {type(exc).__name__}: {exc}"[:300]) from exc
        left = len(data) - buf.tell()
        if left:
            raise DecodeError(f"avro: {left} byte(s) left over after the record "
                              "(written with another schema?)")
        return value

    return decode


def decoder_for(binding: Binding, registries: RegistryClients | None = None) -> Decoder:
    """The payload decoder of a binding's format (``registries``: the clients of the
    schema registries, for a registry-framed binding)."""
    payload = binding.payload
    if payload.schema_registry is not None:
        return framed_decoder(payload.format, payload.schema_registry, binding.source.topic,
                              payload.schema, registries or RegistryClients())
    if payload.format == "json":
        return decode_json
    if payload.format == "bytes":
        return decode_bytes
    if payload.format == "avro":
        try:
            schema = payload.parsed_schema()
        except Exception as exc:
            return _always(f"avro: the binding's schema does not parse: {exc}")
        if schema is None:
            return _always("avro: the binding has no schema")
        return avro_decoder(schema)
    return _always(f"unknown payload format {payload.format!r}")


def _always(reason: str) -> Decoder:
    def decode(data: bytes | None) -> Any:
        raise DecodeError(reason)

    return decode
