"""What the platform's spans take from OpenTelemetry's SDK, imported only while tracing is
on: span ids that can be given (a record's first attempt takes the ids derived from its
origin, :func:`asynctier.platform.tracing.derived_parent`, so that its later attempts,
which derive the same ids, are its children), and a record's parent as a context."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanContext, TraceFlags

from asynctier.platform.tracing import Parent


def span_context(parent: Parent) -> SpanContext:
    """``parent`` as a remote span context (for a link, or to start spans under)."""
    return SpanContext(parent.trace_id, parent.span_id, is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else 0))


def parent_context(parent: Parent) -> Any:
    """A context whose current span is ``parent`` (remote, not recording): spans started
    in it are its children, and kept when it is sampled."""
    return otel.set_span_in_context(otel.NonRecordingSpan(span_context(parent)),
                                    otel_context.Context())


class FixedIds(RandomIdGenerator):
    """Random ids, except inside :meth:`given`, where the next root span takes the ids."""

    def __init__(self) -> None:
        self._given = threading.local()

    @contextmanager
    def given(self, trace_id: int, span_id: int) -> Iterator[None]:
        """The root span started inside takes ``trace_id`` and ``span_id``."""
        self._given.ids = [trace_id, span_id]
        try:
            yield
        finally:
            self._given.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._given, "ids", None)
        return ids[0] if ids else super().generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._given, "ids", None)
        return ids[1] if ids else super().generate_span_id()
