"""Every name the platform puts on Kafka and Redis, made in one place.

Topic, group and key names all start from one *prefix* (``asynctier`` by default), so a
test, a staging copy or a second team can run its own isolated platform on the same broker
and Redis by choosing another prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "asynctier"

#: Header names carried by records in delay and dead-letter topics.
H_BINDING = "asynctier.binding"
H_ATTEMPT = "asynctier.attempt"
H_DUE = "asynctier.due"
H_ORIGIN = "asynctier.origin"
H_ERROR = "asynctier.error"
H_FIRST_SEEN = "asynctier.first-seen"
H_ATTEMPTS_MADE = "asynctier.attempts-made"
H_REASON = "asynctier.reason"
H_CHARGED = "asynctier.charged"
H_REPLAYED = "asynctier.replayed"
#: A Kafka record moved into the queue keeps its key in this header (queue items have none).
H_KEY = "asynctier.key"
#: A dead letter of a ``--ordering key`` binding: the records of its key that run after it.
H_RAN_AFTER = "asynctier.ran-after"
#: A dead letter of a registry-framed binding: the schema id its payload is framed with.
H_SCHEMA_ID = "asynctier.schema-id"
#: A delay record's six headers above (binding, attempt, due, origin, first seen, error)
#: packed into one value (``delay_streams/handoff.py``, :func:`pack_delay`): a Kafka
#: header costs the client and the broker per header, and a retry flood writes one delay
#: record per record read.
H_DELAY = "asynctier.delay"
PLATFORM_HEADERS = (
    H_DELAY,
    H_BINDING,
    H_ATTEMPT,
    H_DUE,
    H_ORIGIN,
    H_ERROR,
    H_FIRST_SEEN,
    H_ATTEMPTS_MADE,
    H_REASON,
    H_CHARGED,
    H_REPLAYED,
    H_KEY,
    H_RAN_AFTER,
    H_SCHEMA_ID,
)

_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Names:
    """Topic, consumer-group and Redis-key names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(
                f"prefix {self.prefix!r} is not valid: use letters, digits, '_' or '-' "
                "(at most 64 characters)"
            )

    @property
    def bindings_topic(self) -> str:
        """The compacted topic that holds every binding, keyed by name."""
        return f"{self.prefix}.bindings"

    def group(self, binding: str) -> str:
        """The consumer group of a binding's tailer."""
        return f"{self.prefix}.{binding}"

    def delay_topic(self, interval: str) -> str:
        """The delay topic of one ladder interval, such as ``30s``."""
        return f"{self.prefix}.delay.{interval}"

    def delay_group(self, interval: str) -> str:
        """The consumer group of the delay tailer of one interval."""
        return f"{self.prefix}.delay.{interval}"

    def dlq_topic(self, binding: str) -> str:
        """The dead-letter topic of a binding."""
        return f"{self.prefix}.dlq.{binding}"

    def dlq_replay_group(self, binding: str) -> str:
        """The consumer group that remembers how far ``dlq replay`` has gone."""
        return f"{self.prefix}.dlq-replay.{binding}"

    def moved_topic(self, binding: str) -> str:
        """The queue topic (in the binding's tenant namespace) into which a Kafka binding
        with long work moves its records (``Binding.moved_to_queue``)."""
        return f"{self.prefix}.moved.{binding}"

    def redis_key(self, *parts: str) -> str:
        """A Redis key under the prefix: ``asynctier:rate:<binding>`` and so on."""
        return ":".join((self.prefix, *parts))

    def redis_tagged_key(self, tag: str, *parts: str) -> str:
        """A Redis key with the hash tag ``{tag}``: ``asynctier:{tenant:acme}:quota``.

        Redis Cluster puts every key of one tag in one slot, so one Lua script may touch
        them all; binding, tenant and prefix names hold no brace."""
        return ":".join((self.prefix, "{" + tag + "}", *parts))

    def tenant_key(self, tenant: str, *parts: str) -> str:
        """A key of one tenant (its quota, usage, charges, enqueue capacity)."""
        return self.redis_tagged_key(f"tenant:{tenant}", *parts)

    def once_key(self, binding: str, *parts: str) -> str:
        """A run-once key of one binding (claims, done bitmaps, holders)."""
        return self.redis_tagged_key(f"once:{binding}", *parts)
