"""Registry-framed records against a real Apicurio Registry (its Confluent-compatible API),
written by confluent-kafka's own serializers.

The decoder alone: writer versions resolved to the reader schema, each failure sorted
(``unknown_schema``, ``not_framed``, ``undecodable``, the registry down: a retry), and
Protobuf read by its writer's descriptor. Then the platform's processes drain Avro v1 and
v2, JSON Schema and Protobuf records; the registry is frozen
mid-drain and no record is dead-lettered for it (the JSON Schema binding runs in worker
processes, which decode with the config's registry settings too). With ``--long`` the
registry is stopped for 20 s instead (and restarted: its schemas are kept). An HTTPS
registry is read with the CA the config names.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from asynctier.cli import main
from asynctier.dev import RegistryNode, start_test_registry
from asynctier.dev.certs import write_certs
from asynctier.dev.process import TlsFiles
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Payload, PayloadFormat, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import BindingError, DecodeError, SchemaRegistryUnavailable
from asynctier.platform.framed import RegistryClients, schema_id_of
from asynctier.platform.payloads import decoder_for
from asynctier.scheduler.outcomes import undecodable
from asynctier.submitter.protocol import Workload
from asynctier.submitter.validation import Validator
from tests.funcs.shapes import kept
from tests.helpers import record_headers, wait_until
from tests.platform_harness import Platform, read_topic

V1 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"}]}
V2 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"},
                 {"name": "note", "type": "string", "default": "none"}]}
V3 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"},
                 {"name": "note", "type": "string", "default": "none"},
                 {"name": "qty", "type": "int", "default": 1}]}
JSON_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}},
               "required": ["id"]}
UNKNOWN_ID = 987_654
FREEZE_S = 4.0
OUTAGE_S = 20.0
REGISTRY_CALL_S = 15


def _registry_client(url: str) -> SchemaRegistryClient:
    """The tests' own client: a call that gets no answer in 15 s is retried (three times) and
    then fails the test, where the client's default would wait for ever."""
    return SchemaRegistryClient({"url": url, "timeout": REGISTRY_CALL_S, "max.retries": 3})


def _frame(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def _serializer(url: str, schema: dict[str, Any], json_schema: bool = False) -> Callable[
        [dict[str, Any], str], bytes]:
    client = _registry_client(url)
    text = json.dumps(schema)
    ser = JSONSerializer(text, client) if json_schema else AvroSerializer(client, text)

    def write(doc: dict[str, Any], topic: str) -> bytes:
        value = ser(doc, SerializationContext(topic, MessageField.VALUE))
        assert value is not None
        return value

    return write


def proto_classes(version: int) -> dict[str, Any]:
    """Message classes of ``shop/order.proto`` (no protoc here: built from a descriptor),
    as a team's generated code would be: ``Header``, then ``Order`` (so Order's frame
    names message index 1) with a nested ``Line``; version 2 adds ``Order.qty``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name=f"shop/order-v{version}.proto",
                                              package="shop", syntax="proto3")
    file.message_type.add(name="Header").field.add(name="source", number=1,
                                                   type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    order.field.add(name="note", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    order.field.add(name="lines", number=3, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED,
                    type_name=".shop.Order.Line")
    if version > 1:
        order.field.add(name="qty", number=4, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{name}"))
            for name in ("Header", "Order", "Order.Line")}


def _proto_serializer(url: str, version: int) -> Callable[[dict[str, Any], str], bytes]:
    """confluent-kafka's own ProtobufSerializer of ``Order`` (version 1 or 2)."""
    classes = proto_classes(version)
    ser = ProtobufSerializer(classes["Order"], _registry_client(url),
                             {"use.deprecated.format": False})

    def write(doc: dict[str, Any], topic: str) -> bytes:
        message = classes["Order"](id=doc["id"], note=doc.get("note", ""),
                                   lines=[classes["Order.Line"](sku=s) for s in doc["skus"]])
        if "qty" in doc:
            message.qty = doc["qty"]
        value = ser(message, SerializationContext(topic, MessageField.VALUE))
        assert value is not None
        return value

    return write


def _binding(topic: str, url: str, fmt: PayloadFormat = "avro",
             reader: dict[str, Any] | None = None) -> Binding:
    return Binding(f"b{abs(hash(topic)) % 10_000}", Source("kafka", topic),
                   "tests.funcs.shapes:keep",
                   payload=Payload(fmt, None if reader is None else json.dumps(reader), url))


# --------------------------------------------------------------------------- the decoder


def test_writer_versions_resolve_to_the_reader_schema(schema_registry: RegistryNode,
                                                      prefix: str) -> None:
    topic = f"{prefix}.orders"
    old = _serializer(schema_registry.url, V1)({"id": 1}, topic)
    new = _serializer(schema_registry.url, V2)({"id": 2, "note": "gift"}, topic)
    assert schema_id_of(old) != schema_id_of(new)
    as_v2 = decoder_for(_binding(topic, schema_registry.url, reader=V2))
    assert as_v2(old) == {"id": 1, "note": "none"}  # the reader's default fills the gap
    assert as_v2(new) == {"id": 2, "note": "gift"}
    as_written = decoder_for(_binding(topic, schema_registry.url))
    assert as_written(old) == {"id": 1}


def test_protobuf_records_read_as_their_writer_wrote_them(schema_registry: RegistryNode,
                                                          prefix: str) -> None:
    """Protobuf written by confluent's serializer, versions 1 and 2 of the message (a field
    added): both decode, by the descriptor of their own schema id, to protobuf's JSON
    mapping with every field; the failures are sorted as for Avro."""
    topic = f"{prefix}.pb-orders"
    old = _proto_serializer(schema_registry.url, 1)({"id": 1, "skus": ["a", "b"]}, topic)
    new = _proto_serializer(schema_registry.url, 2)(
        {"id": 2, "note": "gift", "skus": [], "qty": 3}, topic)
    assert schema_id_of(old) != schema_id_of(new)
    assert old[5] != 0, "Order is message 1 of its file: the frame names its index"
    decode = decoder_for(_binding(topic, schema_registry.url, "protobuf"))
    assert decode(old) == {"id": 1, "note": "", "lines": [{"sku": "a"}, {"sku": "b"}]}
    assert decode(new) == {"id": 2, "note": "gift", "lines": [], "qty": 3}
    # a schema registered as .proto text (as Java's serializer does) reads the same way
    text = ('syntax = "proto3";\npackage shop;\nmessage Header { string source = 1; }\n'
            "message Order { int32 id = 1; string note = 2; }\n")
    text_id = _registry_client(schema_registry.url).register_schema(
        f"{topic}-text", Schema(text, "PROTOBUF"))
    body = proto_classes(1)["Order"](id=5, note="t").SerializeToString()
    assert decode(_frame(text_id, b"\x02\x02" + body)) == {"id": 5, "note": "t"}
    for reason, payload in {"unknown_schema": _frame(UNKNOWN_ID, new[5:]),
                            "not_framed": b"\x08\x01",
                            "undecodable": new[:7] + b"\x12\x09gi"}.items():
        with pytest.raises(DecodeError) as caught:
            decode(payload)
        assert caught.value.reason == reason, caught.value


def test_each_failure_has_its_own_reason(schema_registry: RegistryNode, prefix: str) -> None:
    topic = f"{prefix}.orders"
    good = _serializer(schema_registry.url, V2)({"id": 3, "note": "x"}, topic)
    decode = decoder_for(_binding(topic, schema_registry.url, reader=V2))
    cases = {
        "unknown_schema": _frame(UNKNOWN_ID, good[5:]),
        "not_framed": b'{"id": 3}',
        "undecodable": good[:5] + b"\x02",  # a string whose bytes are missing
    }
    for reason, payload in cases.items():
        with pytest.raises(DecodeError) as caught:
            decode(payload)
        assert caught.value.reason == reason, caught.value
        outcome = undecodable(7, caught.value)
        assert (outcome["status"], outcome["reason"]) == ("failed", reason)
    with pytest.raises(DecodeError, match=f"schema id {UNKNOWN_ID} is not in the registry"):
        decode(cases["unknown_schema"])


def test_a_registry_that_does_not_answer_is_a_retry_not_a_dead_letter(
        schema_registry: RegistryNode, prefix: str) -> None:
    topic = f"{prefix}.orders"
    framed = _serializer(schema_registry.url, V1)({"id": 4}, topic)
    nowhere = "http://127.0.0.1:9/apis/ccompat/v7"  # discard: nothing listens
    decode = decoder_for(_binding(topic, nowhere), RegistryClients({"max.retries": "0"}))
    with pytest.raises(SchemaRegistryUnavailable, match="did not answer") as caught:
        decode(framed)
    outcome = undecodable(7, caught.value)
    assert outcome["status"] == "retry" and not outcome["spends_attempt"]
    assert outcome["reason"] == "registry_unavailable"


def test_an_https_registry_is_read_with_the_configs_ca(tmp_path: Path, prefix: str) -> None:
    certs = write_certs(tmp_path / "certs")
    node = start_test_registry(tmp_path, tls=TlsFiles(certs.ca, certs.server,
                                                      certs.server_key))
    try:
        assert node.url.startswith("https://")
        trusted = RegistryClients({"ssl.ca.location": str(certs.ca), "max.retries": "0"})
        topic = f"{prefix}.tls"
        write = AvroSerializer(trusted.client(node.url), json.dumps(V1))
        framed = write({"id": 5}, SerializationContext(topic, MessageField.VALUE))
        assert framed is not None
        assert decoder_for(_binding(topic, node.url), trusted)(framed) == {"id": 5}
        untrusted = decoder_for(_binding(topic, node.url),
                                RegistryClients({"max.retries": "0"}))
        with pytest.raises(SchemaRegistryUnavailable):  # not the record's fault: retried
            untrusted(framed)
    finally:
        node.stop()


def test_the_submitter_accepts_while_the_registry_is_out_and_refuses_unframed() -> None:
    binding = _binding("orders", "http://127.0.0.1:9/apis/ccompat/v7")  # nothing listens
    check = Validator(binding)
    framed = Workload(payload=_frame(1, b"\x02"), key=None, headers=())
    assert check.problem(framed) is None  # the scheduler decodes it again, retrying
    unframed = check.problem(Workload(payload=b'{"id": 1}', key=None, headers=()))
    assert unframed is not None and "not framed" in unframed


def test_a_binding_names_its_registry_with_a_registry_format() -> None:
    with pytest.raises(BindingError, match="--schema-registry is for --format avro"):
        Binding("b", Source("kafka", "t"), "m:f",
                payload=Payload(format="json",
                                schema_registry="http://r/apis/ccompat/v7")).validate()
    with pytest.raises(BindingError, match="needs --schema-registry"):
        Binding("b", Source("kafka", "t"), "m:f", payload=Payload(format="jsonschema")).validate()
    with pytest.raises(BindingError, match="is not an http"):
        Binding("b", Source("kafka", "t"), "m:f",
                payload=Payload(format="avro", schema_registry="ftp://x")).validate()
    with pytest.raises(BindingError, match="--format protobuf needs --schema-registry"):
        Binding("b", Source("kafka", "t"), "m:f", payload=Payload(format="protobuf")).validate()
    with pytest.raises(BindingError, match="--schema is only for --format avro"):
        Binding("b", Source("kafka", "t"), "m:f",
                payload=Payload(format="protobuf", schema="{}",
                                schema_registry="http://r/x")).validate()
    for fmt in ("avro", "protobuf"):
        kept_binding = Binding("b", Source("kafka", "t"), "m:f",
                               payload=Payload(format=fmt, schema_registry="http://r/x"))
        assert Binding.decode(kept_binding.encode()) == kept_binding


def _cli(settings: Settings, *args: str, input: str | None = None) -> Any:
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_REDIS_URL": settings.redis_url, "ASYNCTIER_PREFIX": settings.prefix,
           "ASYNCTIER_ALLOW_MODULES": "tests", "ASYNCTIER_CONFIG": ""}
    return CliRunner().invoke(main, list(args), env=env, input=input)


def test_produce_frames_lines_and_bind_checks_the_reader_schema(
        settings: Settings, schema_registry: RegistryNode, unique_topic: Callable[..., str],
        tmp_path: Path) -> None:
    topic, url = unique_topic(1), schema_registry.url
    files = {name: tmp_path / f"{name}.avsc" for name in ("v2", "strict")}
    files["v2"].write_text(json.dumps(V2))
    strict = {**V1, "fields": [*V1["fields"], {"name": "customer", "type": "string"}]}
    files["strict"].write_text(json.dumps(strict))
    lines = "".join(json.dumps({"id": i, "note": f"n{i}", "key": f"k{i}"}) + "\n"
                    for i in range(3))
    unregistered = _cli(settings, "produce", topic, "--schema-registry", url, "--schema",
                        str(files["v2"]), input=lines)
    assert unregistered.exit_code != 0  # not registered, and not asked to
    assert "line 1 does not fit the schema" in unregistered.output
    done = _cli(settings, "produce", topic, "--schema-registry", url, "--schema",
                str(files["v2"]), "--register", input=lines)
    assert done.exit_code == 0, done.output
    decode = decoder_for(_binding(topic, url))
    assert [decode(m.value()) for m in read_topic(settings, topic)] == [  # type: ignore[attr-defined]
        {"id": i, "note": f"n{i}"} for i in range(3)]

    base = ["bind", "orders", "--topic", topic, "--function", "tests.funcs.shapes:keep",
            "--format", "avro", "--schema-registry", url, "--check-schema", "--schema"]
    refused = _cli(settings, *base, str(files["strict"]))
    assert refused.exit_code != 0
    assert "cannot read version 1" in refused.output
    assert "No default value for field customer" in refused.output
    assert _cli(settings, *base, str(files["v2"])).exit_code == 0


def test_produce_frames_protobuf_from_a_descriptor_set(
        settings: Settings, schema_registry: RegistryNode, unique_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """JSON lines in protobuf's JSON mapping, framed as ``shop.Order`` of a descriptor set
    (what ``protoc --include_imports --descriptor_set_out`` writes): read back as written."""
    from google.protobuf import descriptor_pb2

    topic, url = unique_topic(1), schema_registry.url
    order = proto_classes(2)["Order"]
    desc = tmp_path / "order.desc"
    fds = descriptor_pb2.FileDescriptorSet()
    order.DESCRIPTOR.file.CopyToProto(fds.file.add())
    desc.write_bytes(fds.SerializeToString())
    lines = "".join(json.dumps({"id": i, "lines": [{"sku": f"s{i}"}]}) + "\n"
                    for i in range(2))
    base = ["produce", topic, "--schema-registry", url, "--format", "protobuf", "--schema",
            str(desc), "--register"]
    ambiguous = _cli(settings, *base, input=lines)
    assert ambiguous.exit_code != 0 and "give --message, one of shop.Header, shop.Order" \
        in ambiguous.output
    unknown = _cli(settings, *base, "--message", "shop.Parcel", input=lines)
    assert "message 'shop.Parcel' is not in the descriptor set" in unknown.output
    done = _cli(settings, *base, "--message", "shop.Order", "--key", "id", input=lines)
    assert done.exit_code == 0, done.output
    decode = decoder_for(_binding(topic, url, "protobuf"))
    assert [decode(m.value()) for m in read_topic(settings, topic)] == [  # type: ignore[attr-defined]
        {"id": i, "note": "", "lines": [{"sku": f"s{i}"}], "qty": 0} for i in range(2)]


# --------------------------------------------------------------------------- the platform


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform, whose registry clients give up fast (one try, 1 s)."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.shapes",))
    plat.config_file().write_text(
        plat.config_file().read_text()
        + '\n[schema_registry]\n"timeout" = "1"\n"max.retries" = "0"\n')
    yield plat
    plat.stop_all()


def _produce(settings: Settings, topic: str, records: list[tuple[str, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for key, value in records:
        producer.produce(topic, value, key.encode())
    assert producer.flush(30) == 0


def _dead_letters(settings: Settings, name: str) -> dict[str, dict[str, bytes]]:
    return {m.key().decode(): dict(m.headers() or ())  # type: ignore[attr-defined]
            for m in read_topic(settings, settings.names.dlq_topic(name))}


@pytest.mark.parametrize("outage", [
    pytest.param("freeze", id="registry-frozen"),
    pytest.param("stop", id="registry-stopped-20s", marks=pytest.mark.slow),
])
def test_framed_records_drain_through_an_outage(
        platform: Platform, settings: Settings, schema_registry: RegistryNode,
        unique_topic: Callable[..., str], tmp_path: Path, outage: str) -> None:
    avro_topic, json_topic, pb_topic = unique_topic(2), unique_topic(1), unique_topic(1)
    url = schema_registry.url
    reader = tmp_path / "order-v2.avsc"
    reader.write_text(json.dumps(V2))
    platform.cli("bind", "orders", "--topic", avro_topic, "--function",
                 "tests.funcs.shapes:keep", "--format", "avro", "--schema", str(reader),
                 "--schema-registry", url, "--retry-ladder", "1s,2s", "--max-attempts", "2")
    platform.cli("bind", "events", "--topic", json_topic, "--function",
                 "tests.funcs.shapes:keep", "--format", "jsonschema",
                 "--schema-registry", url, "--retry-ladder", "1s", "--isolation", "process")
    platform.cli("bind", "parcels", "--topic", pb_topic, "--function",
                 "tests.funcs.shapes:keep", "--format", "protobuf", "--schema-registry", url)
    v1, v2 = _serializer(url, V1), _serializer(url, V2)
    body = v2({"id": 0, "note": "x"}, avro_topic)[5:]
    _produce(settings, avro_topic, [(f"v1-{i}", v1({"id": i}, avro_topic)) for i in range(3)]
             + [(f"v2-{i}", v2({"id": i, "note": "new"}, avro_topic)) for i in range(3)]
             + [("unknown", _frame(UNKNOWN_ID, body)), ("plain", b'{"id": 9}')])
    js = _serializer(url, JSON_SCHEMA, json_schema=True)
    _produce(settings, json_topic, [(f"js-{i}", js({"id": i}, json_topic)) for i in range(3)])
    pb = _proto_serializer(url, 2)
    _produce(settings, pb_topic, [(f"pb-{i}", pb({"id": i, "skus": ["x"], "qty": i}, pb_topic))
                                  for i in range(3)])
    for name in ("scheduler", "tailers", "delay"):
        platform.start(name)
    wait_until(lambda: len(kept(platform.ledger)) == 12, 90, "the first records ran")

    # a writer version no scheduler has seen yet arrives while the registry is out
    v3 = _serializer(url, V3)
    late = [(f"v3-{i}", v3({"id": i, "note": "late", "qty": 5}, avro_topic)) for i in range(20)]
    pid = schema_registry.daemon.pid()
    assert pid is not None
    if outage == "freeze":
        os.kill(pid, signal.SIGSTOP)
    else:
        schema_registry.stop()
    try:
        _produce(settings, avro_topic, late)
        wait_until(lambda: _retried_for_outage(settings), 30, "the scheduler met the outage")
        outage_ends = time.monotonic() + (FREEZE_S if outage == "freeze" else OUTAGE_S)
        wait_until(lambda: time.monotonic() >= outage_ends, OUTAGE_S + 5, "outage over")
    finally:
        if outage == "freeze":
            os.kill(pid, signal.SIGCONT)
        else:
            schema_registry.start()
    wait_until(lambda: all(k in kept(platform.ledger) for k, _ in late), 60,
               "every late record ran")

    got = kept(platform.ledger)
    assert {k: got[k] for k in ("v1-0", "v2-0", "v3-7")} == {
        "v1-0": {"id": 0, "note": "none"}, "v2-0": {"id": 0, "note": "new"},
        "v3-7": {"id": 7, "note": "late"}}  # v3's qty is not in the reader schema
    assert got["js-2"] == {"id": 2}
    assert got["pb-2"] == {"id": 2, "note": "", "lines": [{"sku": "x"}], "qty": 2}
    dead = _dead_letters(settings, "orders")
    assert sorted(dead) == ["plain", "unknown"]  # none for the outage
    assert dead["unknown"][n.H_REASON] == b"unknown_schema"
    assert dead["unknown"][n.H_SCHEMA_ID] == str(UNKNOWN_ID).encode()
    assert dead["plain"][n.H_REASON] == b"not_framed"
    shown = json.loads(platform.cli("dlq", "show", "orders", "0", "--json").stdout)
    assert shown["decoded"].startswith(("(unknown_schema: ", "(not_framed: "))
    assert _dead_letters(settings, "events") == _dead_letters(settings, "parcels") == {}


def _retried_for_outage(settings: Settings) -> bool:
    """True when a v3 record went to the delay topic because the registry did not answer."""
    try:
        delayed = read_topic(settings, settings.names.delay_topic("1s"), timeout_s=5.0)
    except KeyError:  # not created yet
        return False
    return any(m.key().startswith(b"v3-") and b"registry at" in (
        record_headers(m).get(n.H_ERROR) or b"") for m in delayed)
