"""Span ids that can be given: a record's first attempt takes the ids derived from its
origin (:func:`asynctier.platform.tracing.derived_parent`), so that its later attempts,
which derive the same ids, are its children. Imported only while tracing is on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator


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
