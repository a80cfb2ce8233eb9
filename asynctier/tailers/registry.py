"""Which tailer a binding gets: one entry per kind of source (``Binding.source.kind``).

Adding a kind of source is adding an entry here (and its source module, on one of the two
contracts of :mod:`asynctier.tailers.source`); the scheduler, the loops and the manager do
not change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.base import Tailer
from asynctier.tailers.options import TailerOptions
from asynctier.tailers.pipeline import Hook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceKind:
    """How to run the tailers of one kind of source."""

    #: What must exist before the tailers of these bindings start (topics, tables).
    prepare: Callable[[Settings, list[Binding]], None]
    #: The tailer of one binding.
    tailer: Callable[[Settings, Binding, SchedulerClient, TailerOptions, Hook], Tailer]


def _kafka_prepare(settings: Settings, bindings: list[Binding]) -> None:
    from asynctier.delay_streams.topics import ensure_binding_topics
    from asynctier.platform.kafka import admin, topic_partitions

    ensure_binding_topics(settings, bindings)
    for binding in bindings:
        if topic_partitions(admin(settings), binding.source.topic) is None:
            log.error("binding %s: topic %s does not exist; its tailer starts and waits "
                      "for it (create the topic, or unbind)", binding.name, binding.source.topic)


def _kafka_tailer(settings: Settings, binding: Binding, client: SchedulerClient,
                  options: TailerOptions, hook: Hook) -> Tailer:
    if binding.moved_to_queue:  # long work: moved into the queue, run there with leases
        from asynctier.tailers.moved import MovedTailer

        return MovedTailer(settings, binding, client, options, hook=hook)
    from asynctier.tailers.kafka import KafkaTailer

    return KafkaTailer(settings, binding, client, options, hook=hook)


def _queue_prepare(settings: Settings, bindings: list[Binding]) -> None:
    """Nothing to make: the store's schema is migrated when a store opens."""


def _queue_tailer(settings: Settings, binding: Binding, client: SchedulerClient,
                  options: TailerOptions, hook: Hook) -> Tailer:
    from asynctier.tailers.queue import QueueTailer

    return QueueTailer(settings, binding, client, options, hook=hook)


SOURCES: dict[str, SourceKind] = {
    "kafka": SourceKind(_kafka_prepare, _kafka_tailer),
    "queue": SourceKind(_queue_prepare, _queue_tailer),
}


def kind_of(binding: Binding) -> SourceKind:
    """The source kind of ``binding`` (validated bindings name a known one)."""
    return SOURCES[binding.source.kind]


def prepare(settings: Settings, bindings: Iterable[Binding]) -> None:
    """Make what the tailers of ``bindings`` need, kind by kind."""
    by_kind: dict[str, list[Binding]] = {}
    for binding in bindings:
        by_kind.setdefault(binding.source.kind, []).append(binding)
    for kind, group in by_kind.items():
        SOURCES[kind].prepare(settings, group)
