"""Bindings stored by an older release still read: the schema history and the
single-object encoding (asynctier/platform/schemas.py)."""

from __future__ import annotations

import io
import json
from importlib import resources

import fastavro
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Limits, Retries, Source
from asynctier.platform.schemas import MAGIC, decode_stored, history, load_schema

SAMPLE = Binding("orders", Source("kafka", "orders-in"), "tests.faults.funcs:run", tenant="shop",
                 limits=Limits(rate_per_s=50.0),
                 retries=Retries(max_attempts=3, ladder_s=(1.0, 2.0)))


def _written_with(schema: object, binding: Binding) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, binding.to_record())
    return buf.getvalue()


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
