"""Payloads framed in the schema-registry wire format: a zero magic byte, the writer
schema's id (4 bytes, big-endian), then the body (Protobuf: the message's indexes in its
file first, as zigzag varints).

confluent-kafka's ``schema_registry`` serdes do the work (fastavro underneath for Avro):
the writer schema is fetched once per id and cached by the client, and an Avro binding's
reader schema (``--schema``) resolves every writer version to one shape. A Protobuf record
is read with its writer's descriptor (fetched in the registry's ``serialized`` form, as
confluent's deserializer does) and handed over as protobuf's JSON mapping: a message
decodes by field numbers, so every writer version reads the same way. What goes wrong
is sorted here, because it decides what becomes of the record:

- the registry does not answer (refused, timed out, 5xx, 401/403): the record is not at
  fault, :class:`SchemaRegistryUnavailable`, retried without spending an attempt;
- the id is not in the registry: ``unknown_schema``; the payload is not framed at all:
  ``not_framed``; the body does not match its schema: ``undecodable`` (dead letters).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from asynctier.platform.errors import BindingError, DecodeError, SchemaRegistryUnavailable
from asynctier.platform.wire import NOT_FRAMED, UNDECODABLE, UNKNOWN_SCHEMA

#: The formats a binding may read through a registry.
FRAMED_FORMATS = ("avro", "jsonschema", "protobuf")
#: How long one registry call may take, and how often the client tries it, unless the
#: ``[schema_registry]`` table says otherwise: a chunk waits that long per new id.
DEFAULT_CLIENT_CONFIG = {"timeout": "5", "max.retries": "1", "retries.wait.ms": "200"}
#: The client keys that take a number (the config file gives text).
NUMERIC_KEYS = frozenset({"timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms"})

Decoder = Callable[[bytes | None], Any]
# confluent-kafka's schema_registry package is imported where a registry is used: it takes
# more than half a second, which every scheduler, worker and CLI start would pay.


def schema_id_of(data: bytes | None) -> int | None:
    """The schema id a payload is framed with (None: it is not framed)."""
    if data is None or len(data) < 6 or data[0] != 0:
        return None
    return int.from_bytes(data[1:5], "big")


class RegistryClients:
    """One client per registry URL, made with the ``[schema_registry]`` settings
    (credentials, TLS files, timeouts: confluent-kafka's own keys), shared by every
    binding that reads from it so each schema is fetched once per process."""

    def __init__(self, config: Mapping[str, str] | None = None) -> None:
        self.config = {**DEFAULT_CLIENT_CONFIG, **(config or {})}
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def client(self, url: str) -> Any:
        """The ``SchemaRegistryClient`` of ``url``, made on first use."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        with self._lock:
            found = self._clients.get(url)
            if found is None:
                conf: dict[str, Any] = {**self.config, "url": url}
                for key in NUMERIC_KEYS & conf.keys():
                    conf[key] = float(conf[key]) if key == "timeout" else int(conf[key])
                found = self._clients[url] = SchemaRegistryClient(conf)
            return found


def framed_decoder(fmt: str, url: str, topic: str, reader_schema: str | None,
                   clients: RegistryClients) -> Decoder:
    """A decoder of registry-framed ``fmt`` payloads of ``topic`` (``reader_schema``: an
    Avro schema, JSON text, every writer version is resolved to)."""
    from confluent_kafka.schema_registry import SchemaRegistryError, topic_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = clients.client(url)
    conf = {"subject.name.strategy": topic_subject_name_strategy}
    deserialize: Callable[[bytes, Any], Any]
    if fmt == "avro":
        deserialize = _avro_reader(client, AvroDeserializer(client, reader_schema, conf=conf),
                                   reader_schema)
    elif fmt == "jsonschema":
        deserialize = JSONDeserializer(None, schema_registry_client=client, conf=conf)
    elif fmt == "protobuf":
        deserialize = _protobuf_reader(client)
    else:
        raise ValueError(f"{fmt!r} is not a registry format ({', '.join(FRAMED_FORMATS)})")
    # Avro reads without a context: confluent's per-record subject and rule look-ups (which
    # a binding does not use) cost a third more; JSON Schema needs one.
    ctx = None if fmt in ("avro", "protobuf") else SerializationContext(topic,
                                                                       MessageField.VALUE)

    def decode(data: bytes | None) -> Any:
        schema_id = schema_id_of(data)
        if data is None or schema_id is None:
            raise DecodeError(_not_framed(data), NOT_FRAMED)
        try:
            return deserialize(data, ctx)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(f"schema id {schema_id} is not in the registry at {url}",
                                  UNKNOWN_SCHEMA, schema_id) from None
            raise SchemaRegistryUnavailable(
                f"the registry at {url} answered {exc.http_status_code} for schema id "
                f"{schema_id}: {exc.error_message}"[:300], schema_id) from None
        except Exception as exc:  # the serdes and their HTTP client raise many kinds
            if _is_transport(exc):
                raise SchemaRegistryUnavailable(
                    f"the registry at {url} did not answer for schema id {schema_id}: "
                    f"{type(exc).__name__}: {exc}"[:300], schema_id) from None
            raise DecodeError(f"{fmt} (schema id {schema_id}): {type(exc).__name__}: "
                              f"{exc}"[:300], UNDECODABLE, schema_id) from None

    return decode


def _avro_reader(client: Any, first: Callable[[bytes, Any], Any],
                 reader_schema: str | None) -> Callable[[bytes, Any], Any]:
    """Avro bodies read by fastavro with the writer schema the registry client fetched.

    The first record of each schema id goes through confluent's deserializer (``first``:
    it fetches and checks the schema, and the client caches it); the next ones are read by
    ``fastavro.schemaless_reader`` with that writer schema and the reader schema, which is
    what confluent's deserializer does underneath, without its per-record schema
    expansion and look-ups (a third of the cost). A writer schema that references others
    keeps confluent's path."""
    import io

    import fastavro

    reader = None if reader_schema is None else fastavro.parse_schema(json.loads(reader_schema))
    writers: dict[int, Any] = {}  # schema id -> parsed writer schema (None: confluent's)

    def read(data: bytes, ctx: Any) -> Any:
        schema_id = int.from_bytes(data[1:5], "big")
        writer = writers.get(schema_id, _UNSEEN)
        if writer is None:
            return first(data, ctx)
        if writer is _UNSEEN:
            value = first(data, ctx)
            schema = client.get_schema(schema_id)
            writers[schema_id] = (None if schema.references
                                  else fastavro.parse_schema(json.loads(schema.schema_str)))
            return value
        return fastavro.schemaless_reader(io.BytesIO(data[5:]), writer, reader)

    return read


_UNSEEN = object()


def _protobuf_reader(client: Any) -> Callable[[bytes, Any], Any]:
    """Protobuf bodies read with the writer's message class, made once per schema id and
    message indexes from the registry's descriptor (confluent's helpers build its pool,
    with the well-known types and the schema's references), then turned into protobuf's
    JSON mapping with every field, set or not, under its name in the ``.proto``."""
    import io

    from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
    from confluent_kafka.schema_registry.common.serde import SchemaId
    from confluent_kafka.schema_registry.protobuf import _init_pool
    from google.protobuf import json_format, message_factory
    from google.protobuf.descriptor_pool import DescriptorPool

    classes: dict[tuple[int, tuple[int, ...]], Any] = {}

    def message_class(schema_id: int, indexes: tuple[int, ...]) -> Any:
        schema, file = _descriptor(client, schema_id)
        pool = DescriptorPool()
        _init_pool(pool)
        _resolve_named_schema(schema, client, pool)
        pool.AddSerializedFile(file.SerializeToString())
        names, messages = [], file.message_type
        for at in indexes:  # a top-level message, then nested ones
            if not 0 <= at < len(messages):
                raise ValueError(f"message index {at} is not in schema id {schema_id} "
                                 f"(it has {len(messages)} there)")
            names.append(messages[at].name)
            messages = messages[at].nested_type
        full = ".".join([file.package, *names] if file.package else names)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))

    def read(data: bytes, ctx: Any) -> Any:
        frame = SchemaId("PROTOBUF")
        body = frame.from_bytes(io.BytesIO(data))
        key = (int(frame.id or 0), tuple(frame.message_indexes or (0,)))
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = message_class(*key)
        message = cls()
        message.ParseFromString(body.read())
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)

    return read


def _descriptor(client: Any, schema_id: int) -> tuple[Any, Any]:
    """The registry's schema ``schema_id`` and its FileDescriptorProto, asked for in the
    ``serialized`` form: Confluent's registry gives it in base64, Apicurio as the bytes
    themselves, and Apicurio refuses (5xx) a schema stored as a base64 descriptor (as
    confluent's serializer registers them), which its plain form then is. (The client
    caches a schema by id whatever its form: so the serialized form is asked for first.)"""
    from confluent_kafka.schema_registry import SchemaRegistryError

    try:
        schema = client.get_schema(schema_id, fmt="serialized")
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise
        schema = client.get_schema(schema_id)
    file = _parsed(schema.schema_str or "")
    if file is None:
        raise ValueError(f"schema id {schema_id}: the registry gives no Protobuf descriptor "
                         "that parses (base64 or serialized); register the schema with "
                         "confluent-kafka's ProtobufSerializer, or as .proto text")
    return schema, file


def _parsed(text: str) -> Any:
    """The FileDescriptorProto ``text`` holds in base64, or as its bytes; None if neither."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError as ProtoDecodeError

    candidates = []
    with contextlib.suppress(binascii.Error, ValueError):
        candidates.append(base64.b64decode(text, validate=True))
    with contextlib.suppress(UnicodeEncodeError):
        candidates.append(text.encode("latin-1"))
    for data in candidates:
        file = descriptor_pb2.FileDescriptorProto()
        try:
            file.ParseFromString(data)
        except ProtoDecodeError:
            continue
        if file.message_type:
            return file
    return None


def framed_encoder(fmt: str, url: str, topic: str, schema: bytes, clients: RegistryClients,
                   register: bool = False, message: str | None = None
                   ) -> Callable[[Any], bytes]:
    """An encoder of documents into registry-framed ``fmt`` payloads of ``topic`` with the
    writer ``schema``, confluent-kafka's serializers: an Avro schema or a JSON Schema (JSON
    text), or for Protobuf a descriptor set (``protoc --include_imports
    --descriptor_set_out``) and the ``message`` of it to write (a JSON document in
    protobuf's JSON mapping). The schema must be registered under the topic's subject
    (``<topic>-value``), or is with ``register``."""
    from confluent_kafka.schema_registry import topic_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = clients.client(url)
    conf = {"auto.register.schemas": register,
            "subject.name.strategy": topic_subject_name_strategy}
    serialize: Callable[[Any, Any], bytes | None]
    if fmt == "avro":
        serialize = AvroSerializer(client, schema.decode(), conf=conf)
    elif fmt == "jsonschema":
        serialize = JSONSerializer(schema.decode(), client, conf=conf)
    elif fmt == "protobuf":
        from google.protobuf import json_format

        cls = message_class(schema, message)
        writer = ProtobufSerializer(cls, client, {**conf, "use.deprecated.format": False})

        def serialize(doc: Any, ctx: Any) -> bytes | None:
            return writer(json_format.ParseDict(doc, cls()), ctx)  # type: ignore[no-any-return]
    else:
        raise ValueError(f"{fmt!r} is not a registry format ({', '.join(FRAMED_FORMATS)})")
    ctx = SerializationContext(topic, MessageField.VALUE)

    def encode(doc: Any) -> bytes:
        value = serialize(doc, ctx)
        if value is None:
            raise ValueError("a null document has no framed payload")
        return value

    return encode


def message_class(descriptor_set: bytes, message: str | None) -> Any:
    """The class of ``message`` (a full name such as ``shop.Order``) of a Protobuf
    descriptor set; BindingError saying what is there when it is not."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError as ProtoDecodeError

    files = descriptor_pb2.FileDescriptorSet()
    try:
        files.ParseFromString(descriptor_set)
    except ProtoDecodeError as exc:
        raise BindingError("schema: a Protobuf schema is a descriptor set (protoc "
                           f"--include_imports --descriptor_set_out=FILE): {exc}") from None
    pool = descriptor_pool.DescriptorPool()
    names = []
    for file in files.file:
        pool.Add(file)
        names += [f"{file.package}.{m.name}" if file.package else m.name
                  for m in file.message_type]
    if not names:
        raise BindingError("schema: the descriptor set has no message (protoc "
                           "--include_imports --descriptor_set_out=FILE)")
    if message is None:
        if len(names) > 1:
            raise BindingError(f"schema: give --message, one of {', '.join(names)}")
        message = names[0]
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(message))
    except KeyError:
        raise BindingError(f"schema: message {message!r} is not in the descriptor set: "
                           f"give one of {', '.join(names)}") from None


def check_reader_schema(url: str, topic: str, reader: str, clients: RegistryClients,
                        samples: int = 20) -> None:
    """Refuse (BindingError, naming the field) an Avro reader schema that cannot read the
    latest version of the subject ``<topic>-value``: records generated from that version
    are written with it and read with ``reader`` by fastavro's own schema resolution."""
    import io

    import fastavro
    from confluent_kafka.schema_registry import SchemaRegistryError
    from fastavro.utils import generate_many

    subject = f"{topic}-value"
    try:
        latest = clients.client(url).get_latest_version(subject)
    except SchemaRegistryError as exc:
        raise BindingError(f"schema: the registry at {url} has no latest version of subject "
                           f"{subject} ({exc.error_message})") from None
    writer = fastavro.parse_schema(json.loads(latest.schema.schema_str))
    parsed = fastavro.parse_schema(json.loads(reader))
    for record in generate_many(writer, samples):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, record)
        buf.seek(0)
        try:
            fastavro.schemaless_reader(buf, writer, parsed)
        except Exception as exc:  # fastavro's SchemaResolutionError and kin
            raise BindingError(
                f"schema: the reader schema cannot read version {latest.version} (schema id "
                f"{latest.schema_id}) of subject {subject}: {exc}") from None


def _is_transport(exc: BaseException) -> bool:
    """True for a network failure of the registry's HTTP client (its own error classes
    are not public API: told apart by their module and a ``TransportError`` base)."""
    if isinstance(exc, OSError):
        return True
    return any(cls.__name__ in ("TransportError", "TimeoutException")
               for cls in type(exc).__mro__)


def _not_framed(data: bytes | None) -> str:
    if data is None:
        return "not framed: the record has no value (a tombstone)"
    head = data[:8].hex(" ")
    return (f"not framed: a registry payload starts with a zero byte and a 4-byte schema "
            f"id; this one ({len(data)} byte(s)) starts with {head or 'nothing'}")
