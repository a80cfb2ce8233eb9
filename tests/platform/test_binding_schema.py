"""Bindings stored by an older release still read: the schema history and the
single-object encoding (asynctier/platform/schemas.py)."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from importlib import resources

import fastavro
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import (
    Breaker,
    Deadlines,
    Execution,
    Limits,
    Payload,
    Retries,
    Source,
)
from asynctier.platform.errors import BindingError
from asynctier.platform.schemas import MAGIC, decode_stored, history, load_schema

SAMPLE = Binding("orders", Source("kafka", "orders-in"), "tests.faults.funcs:run", tenant="shop",
                 limits=Limits(rate_per_s=50.0),
                 retries=Retries(max_attempts=3, ladder_s=(1.0, 2.0)))


def _written_with(schema: object, binding: Binding) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, binding.to_record())
    return buf.getvalue()

#: Every setting away from its default, and the bytes the release before the feature groups
#: wrote for it (then a binding was one flat dataclass).
EVERY = Binding("orders", Source("kafka", "orders-in"), "tests.faults.funcs:run", tenant="shop",
                priority="urgent", payload=Payload(max_bytes=1000),
                limits=Limits(50.0, 7, 3, "fail_closed"), retries=Retries(3, (1.0, 2.0)),
                breaker=Breaker(0.5, 45.0), execution=Execution(12.0, "process", True, "key"),
                deadlines=Deadlines(7200.0, 9000.0, True), created_ms=123)
FLAT_BYTES = bytes.fromhex(
    "c3012731b6f3884c89df0c6f72646572730a6b61666b61126f72646572732d696e0000000000003e"
    "400000000000004e402c74657374732e6661756c74732e66756e63733a72756e0873686f70000000"
    "00020000000000004940020e020606000000000000284004000000000000f03f0000000000000040"
    "0001020202d00ff60102000000000020bc4002000000000094c14002000000000000e03f00000000"
    "008046400201")


def test_the_current_binding_schema_is_in_the_history() -> None:
    """Changing schemas/binding.avsc without adding the new version to schemas/history
    would leave records this release writes unreadable by the next: this fails first."""
    current = load_schema("binding")
    assert any(v == current for v in history("binding").values()), (
        "schemas/binding.avsc is not in schemas/history: copy it there as binding-N.avsc")


def test_a_binding_round_trips_with_its_schema_marked() -> None:
    data = SAMPLE.encode()
    assert data[:2] == MAGIC
    assert Binding.decode(data) == SAMPLE


@pytest.mark.parametrize("version", sorted(
    p.name for p in resources.files("asynctier").joinpath("schemas", "history").iterdir()
    if p.name.startswith("binding-")))
def test_a_binding_written_by_every_older_version_still_reads(version: str) -> None:
    """A record of each historical schema (the first without the marker, as that release
    wrote it) decodes; fields it lacks take their defaults."""
    path = resources.files("asynctier").joinpath("schemas", "history", version)
    old = fastavro.parse_schema(json.loads(path.read_text()))
    body = _written_with(old, SAMPLE)
    data = body if version == "binding-1.avsc" else MAGIC + _mark(old) + body
    assert Binding.decode(data) == SAMPLE


def test_a_binding_from_an_unknown_newer_schema_says_upgrade() -> None:
    data = MAGIC + b"\x00" * 8 + b"\x00"
    with pytest.raises(ValueError, match="upgrade this process"):
        Binding.decode(data)


def test_the_first_version_lacks_the_newer_fields() -> None:
    """The legacy version really is the one before max_payload_bytes: a record written
    with it has no such field, and reads back as None (the Submitter's default)."""
    legacy = history("binding")[b""]
    names = {f["name"] for f in legacy["fields"]}
    assert "max_payload_bytes" not in names
    read = decode_stored("binding", _written_with(legacy, SAMPLE))
    assert read["max_payload_bytes"] is None


def _mark(parsed: object) -> bytes:
    return next(k for k, v in history("binding").items() if v == parsed and k)


def test_the_groups_write_the_bytes_the_flat_binding_wrote() -> None:
    """Grouping the settings is a view: the stored record, and so the bindings topic and a
    process worker's copy, are byte for byte what the flat binding wrote (under binding-5:
    since then the mark is binding-6's, and ``fresh_from_start`` false follows)."""
    assert EVERY.validate().encode()[10:] == FLAT_BYTES[10:] + b"\x00"
    assert Binding.decode(FLAT_BYTES) == EVERY


def test_the_json_view_keeps_the_flat_keys() -> None:
    """``asynctier bindings --json`` shows the stored record: its keys did not change
    (``fresh_from_start`` joined them, issue 49)."""
    doc = EVERY.to_json()
    assert sorted(doc) == [
        "breaker_ratio", "breaker_window_s", "burst", "created_ms", "defer_when_busy",
        "expire_after_s", "format", "fresh_from_start", "function", "idempotent",
        "isolation", "max_attempts", "max_concurrency", "max_payload_bytes", "name",
        "ordering", "priority", "rate_per_s", "redis_policy", "retry_ladder",
        "retry_ladder_s", "schema", "schema_registry", "source", "start_within_s", "tenant",
        "timeout_s"]
    assert doc["source"] == {"kind": "kafka", "topic": "orders-in", "lease_s": 30.0,
                             "queue_after_s": 60.0}
    assert (doc["max_payload_bytes"], doc["retry_ladder"]) == (1000, "1s,2s")
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize(("changes", "message"), [
    ({"source": Source("lake", "t")}, "source: source kind 'lake' is not supported"),
    ({"payload": Payload(max_bytes=0)}, "max payload: max payload 0 bytes is out of range"),
    ({"limits": Limits(burst=0)}, "burst: burst 0 is out of range"),
    ({"retries": Retries(ladder_s=(60.0, 30.0))}, "retry ladder: the retry ladder must"),
    ({"breaker": Breaker(ratio=1.5)}, "breaker: --breaker 150%"),
    ({"execution": Execution(timeout_s=0)}, "timeout: timeout 0s is out of range"),
    ({"deadlines": Deadlines(defer_when_busy=True)}, "defer when busy: --defer-when-busy"),
])
def test_each_group_checks_its_own_fields(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BindingError, match=re.escape(message)):
        SAMPLE.with_changes(**changes).validate()


def test_a_changed_schema_is_parsed_anew() -> None:
    """The parsed schema is kept with the payload it was parsed from, never carried over."""
    one = json.dumps({"type": "record", "name": "A", "fields": [{"name": "a", "type": "int"}]})
    two = json.dumps({"type": "record", "name": "B", "fields": [{"name": "b", "type": "int"}]})
    avro = SAMPLE.with_changes(payload=Payload("avro", one))
    assert avro.payload.parsed_schema()["name"] == "A"
    changed = avro.with_changes(payload=replace(avro.payload, schema=two))
    assert changed.payload.parsed_schema()["name"] == "B"
