"""A binding's settings, grouped by feature: where its records come from (:class:`Source`),
how their payloads decode (:class:`Payload`), how fast they may run (:class:`Limits`), how
failures retry (:class:`Retries`) and trip the breaker (:class:`Breaker`), how one call runs
(:class:`Execution`) and by when a record must start (:class:`Deadlines`).

Each group checks its own fields (``validate``) and raises :class:`BindingError` whose
message names the field and says what to fix; checks that span groups stay with
:class:`~asynctier.platform.binding.Binding`.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import fastavro

from asynctier.platform.durations import format_duration
from asynctier.platform.errors import BindingError

PayloadFormat = Literal["json", "avro", "bytes", "jsonschema", "protobuf"]
RedisPolicy = Literal["fail_open", "fail_closed"]
Isolation = Literal["thread", "process"]
Ordering = Literal["none", "key"]

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

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_URL_RE = re.compile(r"^https?://[^\s/]+(/\S*)?$")


def check(condition: bool, field_name: str, message: str) -> None:
    """Raise BindingError ``field_name: message`` unless ``condition`` holds."""
    if not condition:
        raise BindingError(f"{field_name}: {message}")


@dataclass(frozen=True)
class Source:
    """Where the records come from: a Kafka topic, or a queue topic in the tenant's
    namespace (``--topic`` or ``--queue``)."""

    kind: str  # kafka or queue (SOURCE_KINDS)
    topic: str
    lease_s: float = 30.0  # a queue binding's lease per batch (its items run within it)
    queue_after_s: float = DEFAULT_QUEUE_AFTER_S  # kafka: timeout above this -> moved

    def validate(self) -> None:
        """Return if the source is acceptable, else raise BindingError saying why."""
        check(self.kind in SOURCE_KINDS, "source",
              f"source kind {self.kind!r} is not supported: use {' or '.join(SOURCE_KINDS)}")
        check(_TOPIC_RE.fullmatch(self.topic) is not None and self.topic not in (".", ".."),
              "topic" if self.kind == "kafka" else "queue",
              f"{self.topic!r} is not a valid topic name: 1-249 letters, digits, '.', '_' "
              "or '-'")
        check(1 <= self.queue_after_s <= MAX_TIMEOUT_S, "queue after",
              f"queue-after {self.queue_after_s:g}s is out of range: 1s <= S <= 1h")
        check(1 <= self.lease_s <= 3600, "lease",
              f"lease {self.lease_s:g}s is out of range: 1s <= S <= 1h")


@dataclass(frozen=True)
class Payload:
    """How a record's bytes decode (``--format``, ``--schema``, ``--schema-registry``) and
    how large a submitted one may be (``--max-payload``)."""

    format: PayloadFormat = "json"
    schema: str | None = None  # avro: the schema (with a registry: the reader schema)
    #: The Confluent-compatible API of the schema registry the records are framed for;
    #: None: not framed.
    schema_registry: str | None = None
    #: The largest payload the Submitter accepts for this binding; None: its default (1 MiB).
    max_bytes: int | None = None
    _parsed_schema: Any = field(default=None, init=False, compare=False, repr=False)

    def parsed_schema(self) -> Any:
        """The parsed Avro schema of an ``avro`` payload (parsed once)."""
        if self._parsed_schema is None and self.schema is not None:
            object.__setattr__(self, "_parsed_schema",
                               fastavro.parse_schema(json.loads(self.schema)))
        return self._parsed_schema

    def validate(self) -> None:
        """Return if the payload settings are acceptable, else raise BindingError."""
        check(self.format in FORMATS, "format",
              f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.max_bytes is not None:
            check(1 <= self.max_bytes <= MAX_PAYLOAD_LIMIT, "max payload",
                  f"max payload {self.max_bytes:,} bytes is out of range: give 1 "
                  f"byte to {MAX_PAYLOAD_LIMIT:,} (1MiB)")
        self._validate_registry()
        self._validate_schema()

    def _validate_registry(self) -> None:
        if self.schema_registry is not None:
            check(self.format in REGISTRY_FORMATS, "schema_registry",
                  f"--schema-registry is for --format {' or '.join(REGISTRY_FORMATS)}")
            check(_URL_RE.fullmatch(self.schema_registry) is not None, "schema_registry",
                  f"{self.schema_registry!r} is not an http:// or https:// URL")
        elif self.format in ("jsonschema", "protobuf"):
            raise BindingError(f"schema_registry: --format {self.format} needs "
                               "--schema-registry URL (its records are registry-framed)")

    def _validate_schema(self) -> None:
        if self.format != "avro":
            check(self.schema is None, "schema", "--schema is only for --format avro")
            return
        check(self.schema is not None or self.schema_registry is not None, "schema",
              "--format avro needs --schema FILE (an Avro schema in JSON) or "
              "--schema-registry URL")
        try:
            self.parsed_schema()
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException,
                fastavro.schema.UnknownType) as exc:
            raise BindingError(f"schema: the Avro schema does not parse: {exc}") from exc


@dataclass(frozen=True)
class Limits:
    """How fast and how many at once (``--rate``, ``--burst``, ``--concurrency``), and what
    the limits do while Redis, which shares them, is down (``--redis-policy``)."""

    rate_per_s: float | None = None
    burst: int | None = None
    max_concurrency: int | None = None
    redis_policy: RedisPolicy = "fail_open"

    def validate(self) -> None:
        """Return if the limits are acceptable, else raise BindingError saying why."""
        check(self.redis_policy in REDIS_POLICIES, "redis policy",
              f"{self.redis_policy!r} is not one of {', '.join(REDIS_POLICIES)}")
        if self.rate_per_s is not None:
            check(0 < self.rate_per_s <= 1_000_000, "rate",
                  f"rate {self.rate_per_s:g}/s is out of range: give 0 < N <= 1000000")
        if self.burst is not None:
            check(1 <= self.burst <= 1_000_000, "burst",
                  f"burst {self.burst} is out of range: give 1 <= N <= 1000000")
        if self.max_concurrency is not None:
            check(1 <= self.max_concurrency <= 10_000, "concurrency",
                  f"concurrency {self.max_concurrency} is out of range: 1 <= N <= 10000")


@dataclass(frozen=True)
class Retries:
    """How a failed attempt is tried again: the attempts a record gets and the delays
    between them (``--max-attempts``, ``--retry-ladder``), each delay a delay topic."""

    max_attempts: int = 5
    ladder_s: tuple[float, ...] = DEFAULT_LADDER_S

    def __post_init__(self) -> None:
        # a ladder read from Avro or JSON is a list: kept as a tuple, so equal ladders match
        object.__setattr__(self, "ladder_s", tuple(self.ladder_s))

    @property
    def ladder_names(self) -> tuple[str, ...]:
        """The ladder as interval names (``30s``, ``1m`` ...), which name the delay topics."""
        return tuple(format_duration(s) for s in self.ladder_s)

    def validate(self) -> None:
        """Return if the retries are acceptable, else raise BindingError saying why."""
        check(1 <= self.max_attempts <= 100, "max attempts",
              f"max attempts {self.max_attempts} is out of range: 1 <= N <= 100")
        check(0 < len(self.ladder_s) <= 10, "retry ladder",
              "the retry ladder needs 1 to 10 steps, such as 30s,1m,5m,30m")
        for step in self.ladder_s:
            check(0.5 <= step <= 7 * 86400, "retry ladder",
                  f"ladder step {step:g}s is out of range: 500ms to 7d")
        for before, after in itertools.pairwise(self.ladder_s):
            check(after > before, "retry ladder",
                  f"the retry ladder must increase strictly: {format_duration(after)} "
                  f"comes after {format_duration(before)}")


@dataclass(frozen=True)
class Breaker:
    """``--breaker SHARE%/WINDOW``: when that share of calls fails over the window, new
    records are parked until probes find the downstream well again."""

    ratio: float | None = None  # the failure share (0-1] that opens it; None: no breaker
    window_s: float = 30.0

    def validate(self) -> None:
        """Return if the breaker is acceptable, else raise BindingError saying why."""
        if self.ratio is None:
            return
        check(0 < self.ratio <= 1, "breaker",
              f"--breaker {self.ratio:.0%}: the failure share must be above 0% "
              "and at most 100%, such as 50%/30s")
        check(1 <= self.window_s <= 3600, "breaker",
              f"--breaker window {self.window_s:g}s is out of range: 1s to 1h")


@dataclass(frozen=True)
class Execution:
    """How one call of the function runs: its time limit (``--timeout``), where a sync
    function runs (``--isolation``), whether it may run twice on a record
    (``--idempotent``) and whether a key's records run one at a time (``--ordering``)."""

    timeout_s: float = 30.0
    isolation: Isolation = "thread"  # sync functions: worker threads, or worker processes
    idempotent: bool = False
    ordering: Ordering = "none"

    def validate(self) -> None:
        """Return if the execution settings are acceptable, else raise BindingError."""
        check(self.isolation in ISOLATIONS, "isolation",
              f"isolation {self.isolation!r} is not one of {', '.join(ISOLATIONS)}")
        check(self.ordering in ORDERINGS, "ordering",
              f"ordering {self.ordering!r} is not one of {', '.join(ORDERINGS)}")
        check(0 < self.timeout_s <= MAX_TIMEOUT_S, "timeout",
              f"timeout {self.timeout_s:g}s is out of range: 0 < S <= 1h")


@dataclass(frozen=True)
class Deadlines:
    """By when a record should start (``--start-within``), after when it is useless
    (``--expire-after``), and whether it may wait out a peak (``--defer-when-busy``,
    docs/design.md, Shifting out of peaks)."""

    start_within_s: float | None = None  # should start this long after its record time
    expire_after_s: float | None = None  # not started this long after it: dead, "expired"
    defer_when_busy: bool = False

    def validate(self) -> None:
        """Return if the deadlines are acceptable, else raise BindingError saying why."""
        within, expire = self.start_within_s, self.expire_after_s
        if within is not None:
            check(0 < within <= 30 * 86400, "start within",
                  f"--start-within {within:g}s is out of range: 0 < S <= 30d")
        if expire is not None:
            check(0 < expire <= 30 * 86400, "expire after",
                  f"--expire-after {expire:g}s is out of range: 0 < S <= 30d")
        if within is not None and expire is not None:
            check(expire >= within, "expire after",
                  f"--expire-after {format_duration(expire)} is shorter than --start-within "
                  f"{format_duration(within)}: a record would expire before its deadline")
        if self.defer_when_busy:
            check(within is not None and within >= DEFER_MIN_WINDOW_S, "defer when busy",
                  "--defer-when-busy is for work whose deadline is hours away: give "
                  f"--start-within {format_duration(DEFER_MIN_WINDOW_S)} or more "
                  f"({'none given' if within is None else format_duration(within) + ' given'})"
                  "; records due sooner should not wait out a peak")
