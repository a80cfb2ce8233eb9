"""One root error and narrow children; ``Retry`` and ``Reject`` are control flow, not failures."""

from __future__ import annotations

from collections.abc import Collection, Iterable


class AsynctierError(Exception):
    """Root of every error the platform raises on purpose."""


class ConfigError(AsynctierError):
    """The configuration file or environment is wrong; the message says what to fix."""


def refuse_unknown_keys(table: Iterable[str], known: Collection[str], name: str,
                        source: str) -> None:
    """ConfigError naming the keys of ``[name]`` (in ``source``) that are not ``known``."""
    bad = set(table) - set(known)
    if bad:
        raise ConfigError(f"{source}: unknown key(s) {sorted(bad)} in [{name}]; "
                          f"known keys: {sorted(known)}")


class BindingError(AsynctierError):
    """A binding is refused; the message says which field and what to fix."""


class ModuleNotAllowed(AsynctierError):
    """A function path names a module outside the scheduler's allowed modules."""


class FunctionNotFound(AsynctierError):
    """A function path names a module or attribute that does not exist."""


class DecodeError(AsynctierError):
    """A record's payload does not decode with its binding's format: a dead letter for
    ``reason`` (``undecodable``, ``unknown_schema``, ``not_framed``), ``schema_id`` the
    registry id it was framed with, when it was."""

    def __init__(self, message: str, reason: str = "undecodable",
                 schema_id: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.schema_id = schema_id


class SchemaRegistryUnavailable(DecodeError):
    """The schema registry did not answer (down, 5xx, refused us): not the record's fault,
    so it is retried, never dead-lettered."""

    def __init__(self, message: str, schema_id: int | None = None) -> None:
        super().__init__(message, "registry_unavailable", schema_id)  # wire's reason


class HandoffError(AsynctierError):
    """A record could not be written to a delay or dead-letter topic (not confirmed)."""


class SchedulerUnavailable(AsynctierError):
    """No scheduler answered a submit call."""


class BadReply(AsynctierError):
    """A scheduler's answer fails a check (it does not decode, or names an item it was not
    sent, twice, or not at all, or holds a status, reason or delay the platform does not
    know): nothing is done on its word; the caller treats it as a failure of that
    scheduler. The message says what was wrong."""


class ServiceError(AsynctierError):
    """A local service (Kafka, Redis, PostgreSQL) could not be started, reached or stopped."""


class QueueError(AsynctierError):
    """A queue operation is refused (a bad topic, id, priority, payload...); the message
    names the item and says what to fix."""


class ParentRefused(QueueError):
    """An enqueue refused because of one item's parent (unknown, dead, or later in the
    batch): nothing of the batch was written. ``position``: that item's place in the
    batch; ``parent``: (topic, id); ``problem``: what is wrong with it and what to do."""

    def __init__(self, position: int, item_id: str, topic: str, parent: tuple[str, str],
                 problem: str) -> None:
        super().__init__(f"item {position} ({item_id!r}) of topic {topic!r}: its parent "
                         f"{parent[0]}/{parent[1]} {problem}")
        self.position = position
        self.parent = parent
        self.problem = problem


class ScheduleError(AsynctierError):
    """A schedule refused (a bad cron, time zone, interval, payload) or not found."""


class CheckpointError(AsynctierError):
    """``ctx.checkpoint`` could not save the state (too large, not JSON-able, no queue
    source, the lease lost, no confirmation); the message says which and what to do."""


class QueueUnavailable(AsynctierError):
    """A queue shard (PostgreSQL) cannot be reached; the message names the shard."""


#: The longest delay ``Retry(after=...)`` may ask for (365 days): the delay topics carry a
#: record hop by hop, and a wait longer than this is a bug in the caller, not a plan.
MAX_RETRY_AFTER_S = 365 * 86400.0


class Retry(Exception):
    """Raise from a function to run the record again after ``after`` seconds.

    ``after=None`` follows the binding's retry ladder. ``after`` must be from 0 to 365 days
    (:data:`MAX_RETRY_AFTER_S`); anything else (negative, inf, nan) raises ValueError.
    """

    def __init__(self, after: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        if after is not None and not 0 <= after <= MAX_RETRY_AFTER_S:
            raise ValueError(f"Retry(after={after!r}): the delay must be from 0 to "
                             f"{MAX_RETRY_AFTER_S:g} seconds (365 days)")
        self.after = after
        self.reason = reason


class Reject(Exception):
    """Raise from a function to fail a record for good: it goes to the dead-letter topic."""

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason
