"""An item as the scheduler keeps it: the wire's :class:`~asynctier.platform.wire.Item` plus
what never travels: while a run stream holds it, the state it resumes from and where its
checkpoints go (``ctx.resumed`` and ``ctx.checkpoint``); while tracing is on, the context
its attempt's span gives the function (``ctx.trace``)."""

from __future__ import annotations

from typing import Any, cast

from asynctier.platform.context import Saver
from asynctier.platform.wire import Item


class StreamItem(Item, total=False):
    """An item of a run stream (:mod:`asynctier.scheduler.streaming`), or traced."""

    resumed: Any
    saver: Saver
    trace: Any  # an OpenTelemetry context (:mod:`asynctier.scheduler.traces`)


def resumed_of(item: Item) -> Any:
    """The state ``item`` resumes from (None: from the start, or not a stream's item)."""
    return cast(StreamItem, item).get("resumed")


def saver_of(item: Item) -> Saver | None:
    """Where ``item``'s checkpoints go (None: it cannot checkpoint)."""
    return cast(StreamItem, item).get("saver")


def trace_of(item: Item) -> Any:
    """The trace context ``item``'s function runs in (None: tracing is off)."""
    return cast(StreamItem, item).get("trace")
