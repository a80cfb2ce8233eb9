"""Creation of the delay and dead-letter topics a binding needs."""

from __future__ import annotations

from collections.abc import Iterable

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.durations import format_duration
from asynctier.platform.kafka import (
    DLQ_MAX_MESSAGE_BYTES,
    admin,
    ensure_topics,
    raise_topic_minimums,
    topic_replication,
)

DELAY_PARTITIONS = 8
#: The largest record a delay topic takes. A failing record larger than this (with the
#: platform's headers) is not retried: it goes to the dead-letter topic at once (reason
#: ``too_large``), which takes records up to :data:`DLQ_MAX_MESSAGE_BYTES`.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
_WEEK_MS = 7 * 86400 * 1000


def delay_topic_config(interval_s: float) -> dict[str, str]:
    """Config of a delay topic: broker time stamps (never early), long retention."""
    return {
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": str(max(_WEEK_MS, int(interval_s * 1000 * 20))),
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
    }


def dlq_topic_config() -> dict[str, str]:
    """Config of a dead-letter topic: kept 30 days; any record a scheduler can run fits
    (up to the submit call's size), so that no failing record is left without a place."""
    return {"retention.ms": str(30 * 86400 * 1000),
            "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}


def ensure_binding_topics(settings: Settings, bindings: Iterable[Binding]) -> list[str]:
    """Create the delay topics of every ladder step and the dead-letter topic of each
    binding; return the ones created. A dead-letter topic that was already there (made by a
    version that gave it 8 MB) gets its ``max.message.bytes`` raised to
    :data:`DLQ_MAX_MESSAGE_BYTES`: else a record too large for a delay topic would find no
    place there either, and its binding would wait behind it."""
    names = settings.names
    wanted: dict[str, tuple[int, dict[str, str]]] = {}
    dlqs = []
    for binding in bindings:
        for step in binding.retries.ladder_s:
            wanted[names.delay_topic(format_duration(step))] = (
                DELAY_PARTITIONS, delay_topic_config(step))
        dlq = names.dlq_topic(binding.name)
        dlqs.append(dlq)
        wanted[dlq] = (1, dlq_topic_config())
    if not wanted:
        return []
    client = admin(settings)
    created = ensure_topics(client, wanted, replication=topic_replication(settings))
    raise_topic_minimums(client, {topic: {"max.message.bytes": DLQ_MAX_MESSAGE_BYTES}
                                  for topic in dlqs if topic not in created})
    return created
