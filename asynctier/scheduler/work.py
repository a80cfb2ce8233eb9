"""An item as the scheduler keeps it while a run stream holds it: the wire's
:class:`~asynctier.platform.wire.Item` plus what never travels, the state it resumes from
and where its checkpoints go (``ctx.resumed`` and ``ctx.checkpoint``)."""

from __future__ import annotations

from typing import Any, cast

from asynctier.platform.context import Saver
from asynctier.platform.wire import Item


class StreamItem(Item, total=False):
    """An item of a run stream (:mod:`asynctier.scheduler.streaming`)."""

    resumed: Any
    saver: Saver


def resumed_of(item: Item) -> Any:
    """The state ``item`` resumes from (None: from the start, or not a stream's item)."""
    return cast(StreamItem, item).get("resumed")


def saver_of(item: Item) -> Saver | None:
    """Where ``item``'s checkpoints go (None: it cannot checkpoint)."""
    return cast(StreamItem, item).get("saver")
