"""One root error and narrow children; ``Retry`` and ``Reject`` are control flow, not failures."""

from __future__ import annotations


class AsynctierError(Exception):
    """Root of every error the platform raises on purpose."""


class ConfigError(AsynctierError):
    """The configuration file or environment is wrong; the message says what to fix."""


class BindingError(AsynctierError):
    """A binding is refused; the message says which field and what to fix."""


class ModuleNotAllowed(AsynctierError):
    """A function path names a module outside the scheduler's allowed modules."""


class FunctionNotFound(AsynctierError):
    """A function path names a module or attribute that does not exist."""


class DecodeError(AsynctierError):
    """A record's payload does not decode with its binding's format."""


class HandoffError(AsynctierError):
    """A record could not be written to a delay or dead-letter topic (not confirmed)."""


class SchedulerUnavailable(AsynctierError):
    """No scheduler answered a submit call."""


class ServiceError(AsynctierError):
    """A local service (Kafka, Redis) could not be started, reached or stopped."""


class Retry(Exception):
    """Raise from a function to run the record again after ``after`` seconds.

    ``after=None`` follows the binding's retry ladder.
    """

    def __init__(self, after: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        if after is not None and after < 0:
            raise ValueError("Retry(after=...) must not be negative")
        self.after = after
        self.reason = reason


class Reject(Exception):
    """Raise from a function to fail a record for good: it goes to the dead-letter topic."""

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason
