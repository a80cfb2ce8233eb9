"""The scheduler's spans (docs/design.md, Traces), made only while tracing is on (this
module imports OpenTelemetry: it is imported then only).

Each attempt of an item is one ``process <binding>`` span, from the item's arrival at the
scheduler to its outcome: the gap before its ``run <function>`` child is the time it
waited (in the queue, or refused: the outcome's reason and error say why); the outcome
(``ok``, ``retry`` after some seconds, ``dead`` when that retry would pass the
binding's max attempts, ``failed``) and whether it spent an attempt are its
attributes. The function runs inside the ``run`` span, so its own spans nest there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace as otel
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from asynctier.platform import tracing
from asynctier.platform.binding import Binding
from asynctier.platform.context import Context
from asynctier.platform.tracing_sdk import FixedIds, parent_context, span_context
from asynctier.platform.wire import Item, Outcome
from asynctier.scheduler.resolver import Function
from asynctier.scheduler.work import StreamItem, trace_of

#: The longest error text kept on a span.
ERROR_MAX_CHARS = 500


def _attributes(binding: Binding, item: Item) -> dict[str, Any]:
    queue = binding.source.kind == "queue"
    attrs: dict[str, Any] = {
        "messaging.system": "asynctier.queue" if queue else "kafka",
        "messaging.destination.name": binding.source.topic,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": item["source_ref"],
        "messaging.consumer.group.name": binding.name,
        "asynctier.binding": binding.name,
        "asynctier.tenant": binding.tenant,
        "asynctier.priority": binding.priority,
        "asynctier.attempt": item["attempt"],
        # how long after the record's write (or the item's enqueue) it reached this scheduler
        "asynctier.record_age_ms": max(0, round(time.time() * 1000) - item["record_time_ms"]),
    }
    if queue:
        attrs["asynctier.queue.item_id"] = item["source_ref"].rsplit("/", 1)[-1]
        attrs["asynctier.queue.priority"] = item["priority"]
    return attrs


def _start(binding: Binding, item: Item) -> tuple[Any, Any]:
    """The attempt's span (None when its trace is not kept) and the context its function
    runs in: under a trace that is not kept, the function's own spans are not kept either."""
    headers = [(h["name"], h["value"]) for h in item["headers"]]
    found = tracing.record_trace(headers, item["source_ref"], tracing.sample_ratio())
    if found.malformed is not None:
        tracing.warn_malformed(binding.name, found.malformed)
    if not found.parent.sampled:
        return None, parent_context(found.parent)
    tracer = tracing.tracer()
    links = [Link(span_context(found.link))] if found.link is not None else None
    name, attrs = f"process {binding.name}", _attributes(binding, item)
    if found.derived and item["attempt"] == 1:
        # the record's first attempt is its trace's root, with the ids its later attempts
        # derive as their parent
        ids: FixedIds = tracing.ids()
        with ids.given(found.parent.trace_id, found.parent.span_id):
            span = tracer.start_span(name, otel_context.Context(), SpanKind.CONSUMER, attrs,
                                     links)
    else:
        span = tracer.start_span(name, parent_context(found.parent), SpanKind.CONSUMER, attrs,
                                 links)
    return span, otel.set_span_in_context(span, otel_context.Context())


def _finish(span: Any, outcome: Outcome, last: bool) -> None:
    """``last``: the item's attempt was its binding's last, so a retry that spends it is a
    dead letter (as the source's hand-off decides: its delay topics or its queue)."""
    status = outcome["status"]
    dead = status == "retry" and last and outcome["spends_attempt"]
    span.set_attribute("asynctier.outcome", "dead" if dead else status)
    if status == "ok":
        span.set_status(Status(StatusCode.OK))
    else:
        span.set_attribute("asynctier.spends_attempt", outcome["spends_attempt"])
        if outcome["reason"]:
            span.set_attribute("asynctier.reason", outcome["reason"])
        if outcome["after_s"] is not None:
            span.set_attribute("asynctier.retry_after_s", outcome["after_s"])
        error = (outcome["error"] or "")[:ERROR_MAX_CHARS]
        span.set_status(Status(StatusCode.ERROR, error or status))
    span.end()


class AttemptSpans:
    """The ``process`` spans of one submit call's items: started as they arrive, each
    ended with its outcome."""

    def __init__(self, binding: Binding, items: Sequence[Item]) -> None:
        self.spans: dict[int, Any] = {}
        self.last = {i["id"] for i in items if i["attempt"] >= binding.retries.max_attempts}
        for item in items:
            span, cast(StreamItem, item)["trace"] = _start(binding, item)
            if span is not None:
                self.spans[item["id"]] = span

    def end(self, outcomes: Sequence[Outcome], rest: bool = True) -> None:
        """End each answered item's span with its outcome; with ``rest``, the others too
        (the call went away before they ended) as ``abandoned``."""
        for outcome in outcomes:
            span = self.spans.pop(outcome["id"], None)
            if span is not None:
                _finish(span, outcome, outcome["id"] in self.last)
        if rest:
            for span in self.spans.values():
                span.set_attribute("asynctier.outcome", "abandoned")
                span.end()
            self.spans.clear()


#: A wait at a gate shorter than this is not noted on the attempts' spans.
WAIT_NOTED_S = 0.001


def note_wait(items: Sequence[Item], what: str, waited_s: float) -> None:
    """Note on each kept attempt's span that it waited ``waited_s`` (at a gate, in the
    queue): the reasons of the gap before its run."""
    if waited_s < WAIT_NOTED_S:
        return
    attrs = {"asynctier.waited_ms": round(waited_s * 1000, 3)}
    for item in items:
        trace = trace_of(item)
        span = otel.get_current_span(trace) if trace is not None else None
        if span is not None and span.is_recording():
            span.add_event(what, attrs)


def traced(function: Function) -> Function:
    """``function`` run inside a ``run`` span, child of its item's attempt span: the
    function's own spans nest in it (it is the current span while the function runs). An
    attempt whose trace is not kept runs under its context without a span of its own."""
    tracer, inner = tracing.tracer(), function.call
    name = f"run {function.path}"
    attrs = {"code.function.name": function.path}

    if function.is_async:
        async def call_async(payload: Any, ctx: Context) -> Any:
            if not _kept(ctx.trace):
                token = otel_context.attach(ctx.trace or otel_context.Context())
                try:
                    return await inner(payload, ctx)
                finally:
                    otel_context.detach(token)
            with tracer.start_as_current_span(name, ctx.trace, attributes=attrs):
                return await inner(payload, ctx)
        return Function(function.path, call_async, True)

    def call(payload: Any, ctx: Context) -> Any:
        if not _kept(ctx.trace):
            token = otel_context.attach(ctx.trace or otel_context.Context())
            try:
                return inner(payload, ctx)
            finally:
                otel_context.detach(token)
        with tracer.start_as_current_span(name, ctx.trace, attributes=attrs):
            return inner(payload, ctx)
    return Function(function.path, call, False)


def _kept(trace: Any) -> bool:
    """Whether the attempt whose context is ``trace`` is in a kept trace."""
    return trace is not None and otel.get_current_span(trace).get_span_context().trace_flags.sampled


def traceparent_of(item: Item) -> str | None:
    """The ``traceparent`` of ``item``'s attempt span, for a worker process to run its
    function under (None: its trace is not kept)."""
    trace = trace_of(item)
    if not _kept(trace):
        return None
    context = otel.get_current_span(trace).get_span_context()
    return tracing.Parent(context.trace_id, context.span_id, True).traceparent().decode()


def context_of_traceparent(value: str | None) -> Any:
    """The context a worker process runs a function in, from :func:`traceparent_of`."""
    parent = tracing.parse_traceparent(value)
    if parent is None:
        return None
    return parent_context(parent)
