"""A binding: one topic bound to one Python function, with its limits and retry ladder.

Bindings are checked when bound (:meth:`Binding.validate`) and stored as Avro
(``schemas/binding.avsc``) in the compacted bindings topic. A bad binding raises
:class:`BindingError` whose message names the field and says what to fix.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import fastavro

from asynctier.platform.allowlist import FUNCTION_PATH_RE
from asynctier.platform.durations import format_duration
from asynctier.platform.errors import BindingError
from asynctier.platform.schemas import decode_stored, encode_stored

Priority = Literal["urgent", "normal", "batch"]
PayloadFormat = Literal["json", "avro", "bytes", "jsonschema", "protobuf"]
RedisPolicy = Literal["fail_open", "fail_closed"]
Isolation = Literal["thread", "process"]
Ordering = Literal["none", "key"]

PRIORITIES: tuple[Priority, ...] = ("urgent", "normal", "batch")
FORMATS: tuple[PayloadFormat, ...] = ("json", "avro", "bytes", "jsonschema", "protobuf")
#: The formats that may be read through a schema registry (``--schema-registry``).
REGISTRY_FORMATS: tuple[PayloadFormat, ...] = ("avro", "jsonschema", "protobuf")
REDIS_POLICIES: tuple[RedisPolicy, ...] = ("fail_open", "fail_closed")
ISOLATIONS: tuple[Isolation, ...] = ("thread", "process")
#: A Kafka binding whose timeout is above this runs its records from the queue (moved).
DEFAULT_QUEUE_AFTER_S = 60.0
#: The longest timeout a binding may have (1 h); ``--timeout`` says so.
MAX_TIMEOUT_S = 3600.0
#: ``none``: records run concurrently; ``key``: a key's records one at a time, in offset
#: order (docs/design.md, Per-key order).
ORDERINGS: tuple[Ordering, ...] = ("none", "key")
DEFAULT_LADDER_S: tuple[float, ...] = (30.0, 60.0, 300.0, 1800.0)
#: The kinds of source a binding may name (each has a tailer: asynctier.tailers.registry).
SOURCE_KINDS: tuple[str, ...] = ("kafka", "queue")
#: The highest per-binding payload limit (the queue's item limit, and Kafka's default
#: message.max.bytes is about the same).
MAX_PAYLOAD_LIMIT = 1024 * 1024
#: The shortest ``--start-within`` a ``--defer-when-busy`` binding may have: deferring
#: waits out a peak, which takes more than minutes.
DEFER_MIN_WINDOW_S = 3600.0

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def is_binding_name(name: str) -> bool:
    """Whether ``name`` could name a binding (and so a dead-letter topic)."""
    return _NAME_RE.fullmatch(name) is not None


_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_URL_RE = re.compile(r"^https?://[^\s/]+(/\S*)?$")


@dataclass(frozen=True)
class Binding:
    """A source (a Kafka topic, or a queue topic) bound to a function (docs/design.md,
    Contracts: Binding)."""

    name: str
    topic: str
    function: str
    tenant: str = "default"
    priority: Priority = "normal"
    format: PayloadFormat = "json"
    schema: str | None = None  # avro: the schema (with a registry: the reader schema)
    #: The Confluent-compatible API of the schema registry the records are framed for
    #: (``--schema-registry URL``); None: not framed.
    schema_registry: str | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    max_concurrency: int | None = None
    max_attempts: int = 5
    timeout_s: float = 30.0
    retry_ladder_s: tuple[float, ...] = DEFAULT_LADDER_S
    idempotent: bool = False
    redis_policy: RedisPolicy = "fail_open"
    source_kind: str = "kafka"
    lease_s: float = 30.0  # a queue binding's lease per batch (its items run within it)
    queue_after_s: float = DEFAULT_QUEUE_AFTER_S  # kafka: timeout above this -> moved
    isolation: Isolation = "thread"  # sync functions: worker threads, or worker processes
    #: The largest payload the Submitter accepts for this binding; None: its default (1 MiB).
    max_payload_bytes: int | None = None
    created_ms: int = 0
    start_within_s: float | None = None  # should start this long after its record time
    expire_after_s: float | None = None  # not started this long after it: dead, "expired"
    breaker_ratio: float | None = None  # --breaker 50%/30s: opens at this failure share...
    breaker_window_s: float = 30.0  # ... over this window
    ordering: Ordering = "none"
    #: --defer-when-busy: parked while the schedulers are saturated by other work
    #: (docs/design.md, Shifting out of peaks); needs a --start-within of hours.
    defer_when_busy: bool = False
    _parsed_schema: Any = field(default=None, compare=False, repr=False)

    @property
    def module(self) -> str:
        """The module part of ``function``."""
        return self.function.partition(":")[0]

    @property
    def moved_to_queue(self) -> bool:
        """True for a Kafka binding whose timeout is above its ``queue_after_s``: its
        records are moved into a queue topic the platform owns
        (:meth:`~asynctier.platform.names.Names.moved_topic`) and run from there
        (docs/design.md, Long work on Kafka records)."""
        return self.source_kind == "kafka" and self.timeout_s > self.queue_after_s

    def moved_binding(self, queue_topic: str) -> Binding:
        """The queue binding the moved records run under: the same name, function and
        limits, its source the queue topic ``queue_topic`` (with this binding's lease)."""
        return self.with_changes(source_kind="queue", topic=queue_topic)

    @property
    def ladder_names(self) -> tuple[str, ...]:
        """The ladder as interval names (``30s``, ``1m`` ...), which name the delay topics."""
        return tuple(format_duration(s) for s in self.retry_ladder_s)

    def parsed_schema(self) -> Any:
        """The parsed Avro schema of an ``avro`` binding (parsed once)."""
        if self._parsed_schema is None and self.schema is not None:
            object.__setattr__(self, "_parsed_schema",
                               fastavro.parse_schema(json.loads(self.schema)))
        return self._parsed_schema

    # -- checking -------------------------------------------------------------------------

    def validate(self) -> Binding:
        """Return self if every field is acceptable, else raise BindingError saying why."""
        _check(_NAME_RE.fullmatch(self.name) is not None, "name",
               f"{self.name!r} is not a valid binding name: use 1-63 lower-case letters, "
               "digits, '-' or '_', starting with a letter or digit")
        _check(self.source_kind in SOURCE_KINDS, "source",
               f"source kind {self.source_kind!r} is not supported: use "
               f"{' or '.join(SOURCE_KINDS)}")
        _check(_TOPIC_RE.fullmatch(self.topic) is not None and self.topic not in (".", ".."),
               "topic" if self.source_kind == "kafka" else "queue",
               f"{self.topic!r} is not a valid topic name: 1-249 letters, digits, '.', '_' "
               "or '-'")
        _check(FUNCTION_PATH_RE.fullmatch(self.function) is not None, "function",
               f"{self.function!r} is not a function path: write module:attr, "
               "for example myapp.jobs:resize")
        _check(_TENANT_RE.fullmatch(self.tenant) is not None, "tenant",
               f"{self.tenant!r} is not a valid tenant: letters, digits, '.', '-', '_'")
        _check(self.priority in PRIORITIES, "priority",
               f"priority {self.priority!r} is not one of {', '.join(PRIORITIES)}")
        _check(self.format in FORMATS, "format",
               f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        _check(self.isolation in ISOLATIONS, "isolation",
               f"isolation {self.isolation!r} is not one of {', '.join(ISOLATIONS)}")
        _check(self.redis_policy in REDIS_POLICIES, "redis policy",
               f"{self.redis_policy!r} is not one of {', '.join(REDIS_POLICIES)}")
        _check(self.ordering in ORDERINGS, "ordering",
               f"ordering {self.ordering!r} is not one of {', '.join(ORDERINGS)}")
        _check(self.ordering == "none" or self.source_kind == "kafka", "ordering",
               "--ordering key is for a Kafka topic; a queue orders by priority")
        _check(self.ordering == "none" or not self.moved_to_queue, "ordering",
               f"--ordering key runs from the Kafka topic, but a timeout of "
               f"{self.timeout_s:g}s (over --queue-after {self.queue_after_s:g}s) moves the "
               "records into the queue, where order is not kept: lower --timeout or raise "
               "--queue-after")
        self._validate_numbers()
        self._validate_ladder()
        self._validate_schema()
        return self

    def _validate_numbers(self) -> None:
        if self.rate_per_s is not None:
            _check(0 < self.rate_per_s <= 1_000_000, "rate",
                   f"rate {self.rate_per_s:g}/s is out of range: give 0 < N <= 1000000")
        if self.burst is not None:
            _check(1 <= self.burst <= 1_000_000, "burst",
                   f"burst {self.burst} is out of range: give 1 <= N <= 1000000")
        if self.max_concurrency is not None:
            _check(1 <= self.max_concurrency <= 10_000, "concurrency",
                   f"concurrency {self.max_concurrency} is out of range: 1 <= N <= 10000")
        _check(1 <= self.max_attempts <= 100, "max attempts",
               f"max attempts {self.max_attempts} is out of range: 1 <= N <= 100")
        _check(0 < self.timeout_s <= MAX_TIMEOUT_S, "timeout",
               f"timeout {self.timeout_s:g}s is out of range: 0 < S <= 1h")
        _check(1 <= self.queue_after_s <= MAX_TIMEOUT_S, "queue after",
               f"queue-after {self.queue_after_s:g}s is out of range: 1s <= S <= 1h")
        _check(1 <= self.lease_s <= 3600, "lease",
               f"lease {self.lease_s:g}s is out of range: 1s <= S <= 1h")
        self._validate_deadlines()
        if self.breaker_ratio is not None:
            _check(0 < self.breaker_ratio <= 1, "breaker",
                   f"--breaker {self.breaker_ratio:.0%}: the failure share must be above 0% "
                   "and at most 100%, such as 50%/30s")
            _check(1 <= self.breaker_window_s <= 3600, "breaker",
                   f"--breaker window {self.breaker_window_s:g}s is out of range: 1s to 1h")
        if self.max_payload_bytes is not None:
            _check(1 <= self.max_payload_bytes <= MAX_PAYLOAD_LIMIT, "max payload",
                   f"max payload {self.max_payload_bytes:,} bytes is out of range: give 1 "
                   f"byte to {MAX_PAYLOAD_LIMIT:,} (1MiB)")

    def _validate_deadlines(self) -> None:
        within, expire = self.start_within_s, self.expire_after_s
        if within is not None:
            _check(0 < within <= 30 * 86400, "start within",
                   f"--start-within {within:g}s is out of range: 0 < S <= 30d")
        if expire is not None:
            _check(0 < expire <= 30 * 86400, "expire after",
                   f"--expire-after {expire:g}s is out of range: 0 < S <= 30d")
        if within is not None and expire is not None:
            _check(expire >= within, "expire after",
                   f"--expire-after {format_duration(expire)} is shorter than --start-within "
                   f"{format_duration(within)}: a record would expire before its deadline")
        if self.defer_when_busy:
            _check(within is not None and within >= DEFER_MIN_WINDOW_S, "defer when busy",
                   "--defer-when-busy is for work whose deadline is hours away: give "
                   f"--start-within {format_duration(DEFER_MIN_WINDOW_S)} or more "
                   f"({'none given' if within is None else format_duration(within) + ' given'})"
                   "; records due sooner should not wait out a peak")

    def _validate_ladder(self) -> None:
        ladder = self.retry_ladder_s
        _check(0 < len(ladder) <= 10, "retry ladder",
               "the retry ladder needs 1 to 10 steps, such as 30s,1m,5m,30m")
        for step in ladder:
            _check(0.5 <= step <= 7 * 86400, "retry ladder",
                   f"ladder step {step:g}s is out of range: 500ms to 7d")
        for before, after in itertools.pairwise(ladder):
            _check(after > before, "retry ladder",
                   f"the retry ladder must increase strictly: {format_duration(after)} "
                   f"comes after {format_duration(before)}")

    def _validate_schema(self) -> None:
        if self.schema_registry is not None:
            _check(self.format in REGISTRY_FORMATS, "schema_registry",
                   f"--schema-registry is for --format {' or '.join(REGISTRY_FORMATS)}")
            _check(_URL_RE.fullmatch(self.schema_registry) is not None, "schema_registry",
                   f"{self.schema_registry!r} is not an http:// or https:// URL")
        elif self.format in ("jsonschema", "protobuf"):
            raise BindingError(f"schema_registry: --format {self.format} needs "
                               "--schema-registry URL (its records are registry-framed)")
        if self.format != "avro":
            _check(self.schema is None, "schema",
                   "--schema is only for --format avro")
            return
        _check(self.schema is not None or self.schema_registry is not None, "schema",
               "--format avro needs --schema FILE (an Avro schema in JSON) or "
               "--schema-registry URL")
        try:
            self.parsed_schema()
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException,
                fastavro.schema.UnknownType) as exc:
            raise BindingError(f"schema: the Avro schema does not parse: {exc}") from exc

    # -- storage --------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The Avro record of ``schemas/binding.avsc``."""
        doc = asdict(self)
        doc.pop("_parsed_schema")
        doc["source"] = {"kind": doc.pop("source_kind"), "topic": doc.pop("topic"),
                         "lease_s": doc.pop("lease_s"),
                         "queue_after_s": doc.pop("queue_after_s")}
        doc["retry_ladder_s"] = list(self.retry_ladder_s)
        return doc

    def encode(self) -> bytes:
        """Avro bytes for the bindings topic."""
        return encode_stored("binding", self.to_record())

    @classmethod
    def decode(cls, data: bytes) -> Binding:
        """A binding from the bindings topic's Avro bytes."""
        doc: Any = decode_stored("binding", data)
        source = doc.pop("source")
        doc["source_kind"] = source["kind"]
        doc["topic"] = source["topic"]
        doc["lease_s"] = source["lease_s"]
        doc["queue_after_s"] = source["queue_after_s"]
        doc["retry_ladder_s"] = tuple(doc["retry_ladder_s"])
        return cls(**doc)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view, with the ladder spelt as ``30s,1m,...``."""
        doc = self.to_record()
        doc["retry_ladder"] = ",".join(self.ladder_names)
        return doc

    def with_changes(self, **changes: Any) -> Binding:
        """A copy with some fields changed."""
        return replace(self, _parsed_schema=None, **changes)


def _check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise BindingError(f"{field_name}: {message}")
