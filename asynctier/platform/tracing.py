"""Traces: OpenTelemetry spans for every attempt of every item, exported over OTLP (gRPC).

Tracing is off unless ``[tracing] enabled = true`` or ``OTEL_TRACES_EXPORTER=otlp``
(``OTEL_SDK_DISABLED=true`` turns it off again); while it is off nothing of OpenTelemetry
is imported. The standard variables ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_ENDPOINT``), ``OTEL_TRACES_SAMPLER_ARG`` and ``OTEL_SERVICE_NAME``
win over the table's ``endpoint``, ``sample_ratio`` and ``service_name``.

**Whose trace an item is in.** A record's W3C ``traceparent`` header (with its
``tracestate``), written by its producer or by the SDK inside an application's span, is
the parent of every attempt's span. A record without one, or with one that does not
parse (a warning names the binding, once), gets a context derived from its **origin**,
the position where it was first read (the ``asynctier.origin`` header of a retried record,
else its own source reference): its first attempt's span takes those ids and is the
trace's root, and each later attempt, on whichever scheduler, is its child. So every
attempt of one record is in one trace, and the context never has to travel with it. A
replayed dead letter (``asynctier.replayed``) starts a trace of its own, linked to the one
it came from.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from asynctier.platform import names as n
from asynctier.platform.errors import ConfigError, refuse_unknown_keys
from asynctier.platform.wire import Item

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: W3C trace context, version 00 (a later version may add fields after the flags).
_TRACEPARENT_RE = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
DEFAULT_ENDPOINT = "http://127.0.0.1:4317"
DEFAULT_SERVICE = "asynctier"
#: The table's keys.
KEYS = frozenset({"enabled", "endpoint", "sample_ratio", "service_name", "trace_url"})
_TRACE_URL_RE = re.compile(r"https?://\S+")


@dataclass(frozen=True)
class TracingSettings:
    """``[tracing]``: whether spans are made, where they go, which share of new traces."""

    enabled: bool = False
    endpoint: str = DEFAULT_ENDPOINT
    #: The share of new traces kept (a record with a producer's context follows its
    #: producer's decision).
    sample_ratio: float = 1.0
    service_name: str = DEFAULT_SERVICE
    #: Where people read a trace: a URL with ``{trace_id}`` in it (the console links there;
    #: Jaeger: ``http://jaeger:16686/trace/{trace_id}``); empty: no link.
    trace_url: str = ""

    def trace_link(self, trace_id: str) -> str:
        """The URL of trace ``trace_id`` ('' when no ``trace_url`` is set)."""
        return self.trace_url.replace("{trace_id}", trace_id) if self.trace_url else ""

    @classmethod
    def from_table(cls, table: Mapping[str, Any], source: str) -> TracingSettings:
        """The ``[tracing]`` table; ConfigError names a key it does not know or a bad
        value."""
        refuse_unknown_keys(table, KEYS, "tracing", source)
        enabled = table.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{source}: [tracing] enabled = {enabled!r} is not true or false")
        trace_url = str(table.get("trace_url", ""))
        if trace_url and (_TRACE_URL_RE.fullmatch(trace_url) is None
                          or "{trace_id}" not in trace_url):
            raise ConfigError(f"{source}: [tracing] trace_url = {trace_url!r} is not an http(s) "
                              "URL with {trace_id} in it, such as "
                              "http://jaeger:16686/trace/{trace_id}")
        return cls(enabled, str(table.get("endpoint", DEFAULT_ENDPOINT)),
                   _ratio(table.get("sample_ratio", 1.0), f"{source}: [tracing] sample_ratio"),
                   str(table.get("service_name", DEFAULT_SERVICE)), trace_url)

    def with_env(self, env: Mapping[str, str]) -> TracingSettings:
        """A copy with the standard ``OTEL_*`` variables applied."""
        enabled = self.enabled or env.get("OTEL_TRACES_EXPORTER", "").strip() == "otlp"
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            enabled = False
        endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or self.endpoint)
        ratio = self.sample_ratio
        if env.get("OTEL_TRACES_SAMPLER_ARG"):
            ratio = _ratio(env["OTEL_TRACES_SAMPLER_ARG"], "OTEL_TRACES_SAMPLER_ARG")
        return TracingSettings(enabled, endpoint, ratio,
                               env.get("OTEL_SERVICE_NAME") or self.service_name,
                               self.trace_url)


def _ratio(value: Any, what: str) -> float:
    try:
        ratio = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} = {value!r} is not a number from 0 to 1") from exc
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"{what} = {value!r} is not a number from 0 to 1")
    return ratio


# -- trace context, read without OpenTelemetry ---------------------------------------------


class Parent(NamedTuple):
    """A trace context as a record carries it: its ids, and whether it is sampled (a named
    tuple: one is made per item while tracing is on)."""

    trace_id: int
    span_id: int
    sampled: bool
    state: str = ""

    @property
    def trace_hex(self) -> str:
        """The trace id as Jaeger and the logs print it (32 hex digits)."""
        return f"{self.trace_id:032x}"

    def traceparent(self) -> bytes:
        """The W3C header value."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{int(self.sampled):02x}".encode()


def parse_traceparent(value: bytes | str | None, state: bytes | str | None = None
                      ) -> Parent | None:
    """The context of a ``traceparent`` value; None when it does not follow W3C trace
    context (version ff, all-zero ids, wrong lengths, upper-case hex, extra fields on
    version 00)."""
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    match = _TRACEPARENT_RE.fullmatch(text.strip())
    if match is None:
        return None
    version, trace, span, flags, extra = match.groups()
    if version == "ff" or (version == "00" and extra) or set(trace) == {"0"} or set(span) == {"0"}:
        return None
    if isinstance(state, bytes):
        state = state.decode("ascii", "replace")
    return Parent(int(trace, 16), int(span, 16), bool(int(flags, 16) & 1), state or "")


_LOW_64 = (1 << 64) - 1


def derived_parent(origin: str, sample_ratio: float) -> Parent:
    """The context of a record that came without one, from its origin (the same on every
    attempt, in every process): sampled as OpenTelemetry's ratio sampler would sample its
    trace id."""
    ids = int.from_bytes(hashlib.sha256(b"asynctier-trace\0" + origin.encode()).digest()[:24])
    trace_id, span_id = (ids >> 64) or 1, (ids & _LOW_64) or 1
    # TraceIdRatioBased's test: the trace id's low 64 bits under the ratio's bound
    return Parent(trace_id, span_id, (trace_id & _LOW_64) < round(sample_ratio * (1 << 64)))


class RecordTrace(NamedTuple):
    """Where one attempt of a record belongs: its parent, whether that parent is derived
    (the first attempt then takes its ids), what it links to, and a complaint about a
    malformed header."""

    parent: Parent
    derived: bool
    link: Parent | None = None
    malformed: str | None = None


def record_trace(headers: Sequence[tuple[str, bytes | None]], source_ref: str,
                 sample_ratio: float = 1.0) -> RecordTrace:
    """The trace of one attempt of a record with ``headers`` read at ``source_ref``."""
    if not headers:  # most records: their trace derives from where they were read
        return RecordTrace(derived_parent(source_ref, sample_ratio), True)
    found: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in (TRACEPARENT, TRACESTATE, n.H_ORIGIN, n.H_REPLAYED) and name not in found:
            found[name] = value
    origin_bytes = found.get(n.H_ORIGIN)
    origin = origin_bytes.decode("utf-8", "replace") if origin_bytes else source_ref
    raw = found.get(TRACEPARENT)
    given = parse_traceparent(raw, found.get(TRACESTATE))
    malformed = None
    if raw is not None and given is None:
        malformed = raw[:80].decode("ascii", "replace")
    replayed = found.get(n.H_REPLAYED)
    if replayed is not None:
        # a replay is a new run of the record: a trace of its own, linked to the original
        link = given or derived_parent(origin, sample_ratio)
        mark = replayed.decode("utf-8", "replace")
        return RecordTrace(derived_parent(f"{origin}\0replay\0{mark}", sample_ratio), True,
                           link, malformed)
    if given is not None:
        return RecordTrace(given, False)
    return RecordTrace(derived_parent(origin, sample_ratio), True, None, malformed)


def trace_id_of(headers: Iterable[tuple[str, bytes | None]], source_ref: str) -> str:
    """The trace id an operator looks up for a record (``dlq show``, ``queue show``)."""
    return record_trace(list(headers), source_ref).parent.trace_hex


def with_current_context(headers: tuple[tuple[str, bytes | None], ...]
                         ) -> tuple[tuple[str, bytes | None], ...]:
    """``headers`` and the caller's current span as ``traceparent`` (with its
    ``tracestate``), when the application uses OpenTelemetry, is inside a span, and
    ``headers`` carry no context yet: what the SDK sends with each workload. OpenTelemetry
    is not imported here: an application that has not imported it has no span."""
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None or any(name == TRACEPARENT for name, _ in headers):
        return headers
    context = otel.get_current_span().get_span_context()
    if not context.is_valid:
        return headers
    parent = Parent(context.trace_id, context.span_id, context.trace_flags.sampled)
    extra: list[tuple[str, bytes | None]] = [(TRACEPARENT, parent.traceparent())]
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        extra.append((TRACESTATE, state.encode()))
    return (*headers, *extra)


def item_log_fields(binding: str, item: Item) -> dict[str, str]:
    """The ``extra=`` fields of a log line about one item of a wire call: its binding and
    the trace it is in (what an operator looks up in Jaeger)."""
    pairs = [(h["name"], h["value"]) for h in item["headers"]]
    return {"binding": binding, "trace": trace_id_of(pairs, item["source_ref"])}


# -- the SDK, imported only when tracing is on ---------------------------------------------


class _State:
    """This process's tracer (None while tracing is off), set once by :func:`start`."""

    tracer: Any = None
    provider: Any = None
    ids: Any = None  # its FixedIds
    settings: TracingSettings = TracingSettings()
    lock = threading.Lock()


def enabled() -> bool:
    """Whether this process makes spans."""
    return _State.tracer is not None


def tracer() -> Any:
    """This process's OpenTelemetry tracer (None while tracing is off)."""
    return _State.tracer


def ids() -> Any:
    """This process's id generator (:class:`~asynctier.platform.tracing_sdk.FixedIds`)."""
    return _State.ids


def settings() -> TracingSettings:
    """This process's tracing settings (what its worker processes start with)."""
    return _State.settings


def sample_ratio() -> float:
    """The share of new traces kept."""
    return _State.settings.sample_ratio


def start(settings: TracingSettings, role: str) -> bool:
    """Set up tracing for this process (``role``: scheduler, tailers ...) when
    ``settings`` say so; True when it is on. Spans are batched and exported by the SDK's
    own thread, off the hot path. The provider is the process's global one, so the spans
    a function starts with ``opentelemetry.trace.get_tracer`` go to the same place."""
    if not settings.enabled:
        return False
    with _State.lock:
        if _State.tracer is not None:
            return True
        from opentelemetry import trace as otel
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from asynctier.platform.tracing_sdk import FixedIds

        fixed = FixedIds()
        resource = Resource.create({"service.name": settings.service_name,
                                    "asynctier.role": role, "process.pid": os.getpid()})
        provider = TracerProvider(resource=resource, id_generator=fixed,
                                  sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.endpoint, insecure=_insecure(settings.endpoint))))
        # the process's provider: the functions' own tracers (trace.get_tracer) export here
        otel.set_tracer_provider(provider)
        _State.provider, _State.settings, _State.ids = provider, settings, fixed
        _State.tracer = provider.get_tracer("asynctier")
    log.info("tracing on: spans to %s over OTLP, %.0f%% of new traces kept",
             settings.endpoint, settings.sample_ratio * 100)
    return True


@contextmanager
def running(settings: TracingSettings, role: str) -> Iterator[bool]:
    """Tracing on for a process while it runs (when ``settings`` say so), the spans still
    buffered exported at its end; yields whether it is on."""
    started = start(settings, role)
    try:
        yield started
    finally:
        if started:
            stop()


def _insecure(endpoint: str) -> bool:
    return not endpoint.startswith("https://")


def stop() -> None:
    """Export the spans still buffered and stop (at the process's end)."""
    with _State.lock:
        provider, _State.provider, _State.tracer = _State.provider, None, None
    if provider is not None:
        provider.shutdown()


class _Warned:
    bindings: set[str] = set()
    lock = threading.Lock()


def warn_malformed(binding: str, value: str) -> None:
    """Say once per binding that its records carry a ``traceparent`` that does not parse."""
    with _Warned.lock:
        if binding in _Warned.bindings:
            return
        _Warned.bindings.add(binding)
    log.warning("binding %s: a record's traceparent header %r is not W3C trace context "
                "(00-<32 hex>-<16 hex>-<2 hex>); its attempts start a trace of their own. "
                "Fix the producer's propagator; this is said once per binding", binding, value)
