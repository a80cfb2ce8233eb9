"""The Avro schemas in ``schemas/``, loaded and parsed once per process.

Records kept for good (bindings, in their compacted topic) are written in Avro's
single-object encoding: ``C3 01``, the writer schema's CRC-64-AVRO fingerprint (8 bytes,
little-endian), then the body. Every schema version ever written is kept in
``schemas/history/<name>-<n>.avsc``, so a record written by an older release is read with
the schema it was written with and resolved to the current one (new fields take their
defaults). A record without the marker was written before the marker existed: with
``<name>-1``. When a stored schema changes, add the new version to the history (a test
checks the current schema is there).
"""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

MAGIC = b"\xc3\x01"


def schema_json(name: str) -> Any:
    """The schema ``schemas/<name>.avsc`` (shipped inside the package) as written: JSON."""
    return json.loads(_schemas().joinpath(f"{name}.avsc").read_text())


@cache
def load_schema(name: str) -> Any:
    """The parsed schema ``schemas/<name>.avsc``."""
    return fastavro.parse_schema(schema_json(name))


@cache
def history(name: str) -> dict[bytes, Any]:
    """Every version of ``name`` ever written, parsed, by fingerprint; and ``b""`` for the
    version of records written without the marker (``<name>-1``)."""
    found: dict[bytes, Any] = {}
    for n in range(1, 1000):
        path = _schemas().joinpath("history", f"{name}-{n}.avsc")
        if not path.is_file():
            break
        parsed = fastavro.parse_schema(json.loads(path.read_text()))
        found[_fingerprint(parsed)] = parsed
        found.setdefault(b"", parsed)
    return found


def encode_stored(name: str, record: Any) -> bytes:
    """``record`` in the single-object encoding of the current schema ``name``."""
    schema = load_schema(name)
    buf = io.BytesIO()
    buf.write(MAGIC + _fingerprint(schema))
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def decode_stored(name: str, data: bytes) -> Any:
    """A record of ``name`` written by any version: read with its writer schema, resolved
    to the current one. ValueError when its schema is unknown here (a newer release
    wrote it)."""
    versions = history(name)
    if data[:2] == MAGIC:
        mark, body = data[2:10], data[10:]
        writer = versions.get(mark)
        if writer is None:
            raise ValueError(f"written with a {name} schema this release does not know "
                             f"(fingerprint {mark.hex()}): upgrade this process")
    else:
        writer, body = versions[b""], data
    return fastavro.schemaless_reader(io.BytesIO(body), writer, load_schema(name))


def _fingerprint(parsed: Any) -> bytes:
    mark = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return int(mark, 16).to_bytes(8, "little")


def _schemas() -> Any:
    return resources.files("asynctier").joinpath("schemas")
