"""The tailers' spans: ``read <binding>`` per record of a call whose trace is kept, from
the moment the tailer added it to the call to the moment the call was sent. Its parent is
the record's (:func:`asynctier.platform.tracing.record_trace`), so it sits beside the
attempts' spans in the record's trace. Imported only while tracing is on."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import SpanKind

from asynctier.platform import tracing
from asynctier.platform.tracing_sdk import parent_context

#: What a call remembers of each item while tracing is on: binding, headers, source
#: reference, attempt, and when it was added (epoch ns).
Read = tuple[str, Sequence[tuple[str, bytes | None]], str, int, int]


def read_spans(reads: Sequence[Read], sent_ns: int) -> None:
    """One ``read`` span per kept record of a call sent at ``sent_ns``."""
    tracer, ratio = tracing.tracer(), tracing.sample_ratio()
    if tracer is None:
        return
    for binding, headers, source_ref, attempt, added_ns in reads:
        parent = tracing.record_trace(list(headers), source_ref, ratio).parent
        if not parent.sampled:
            continue
        span = tracer.start_span(
            f"read {binding}", parent_context(parent), SpanKind.CONSUMER,
            {"messaging.operation.type": "receive", "messaging.message.id": source_ref,
             "asynctier.binding": binding, "asynctier.attempt": attempt},
            start_time=added_ns)
        span.end(end_time=sent_ns)
