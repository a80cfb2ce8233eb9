"""How a function's end maps to an outcome (docs/design.md, Contracts: Function).

A return is ``ok``; ``Retry(after)`` is a retry after ``after`` seconds that spends an
attempt; ``Reject(reason)`` fails for good; any other exception retries along the ladder.
"""

from __future__ import annotations

from asynctier.platform.errors import (
    MAX_RETRY_AFTER_S,
    DecodeError,
    Reject,
    Retry,
    SchemaRegistryUnavailable,
)
from asynctier.platform.wire import REGISTRY_UNAVAILABLE, TIMEOUT, Outcome, failed, retry

MAX_ERROR = 500


def error_text(exc: BaseException) -> str:
    """``ExcType: message``, cut to :data:`MAX_ERROR` characters."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def of_exception(item_id: int, exc: BaseException) -> Outcome:
    """The outcome of a function that raised ``exc``."""
    if isinstance(exc, Retry):
        after = exc.after  # checked by Retry(), but an attribute can be set afterwards
        if after is not None and not 0 <= after <= MAX_RETRY_AFTER_S:
            return retry(item_id, f"Retry(after={after!r}) is out of range (0 to "
                                  f"{MAX_RETRY_AFTER_S:g} s); the ladder's delay is used")
        return retry(item_id, exc.reason[:MAX_ERROR], after_s=after)
    if isinstance(exc, Reject):
        return failed(item_id, exc.reason[:MAX_ERROR])  # reason: rejected
    return retry(item_id, error_text(exc))


def timed_out(item_id: int, timeout_s: float) -> Outcome:
    """The outcome of a call that ran past the binding's timeout."""
    return retry(item_id, f"timed out after {timeout_s:g}s", reason=TIMEOUT)


def undecodable(item_id: int, exc: DecodeError) -> Outcome:
    """The outcome of a payload that does not decode: a dead letter at once, for the
    error's reason; while the schema registry does not answer, a retry along the ladder
    that spends no attempt (an outage never dead-letters a record)."""
    if isinstance(exc, SchemaRegistryUnavailable):
        return retry(item_id, str(exc), spends_attempt=False, reason=REGISTRY_UNAVAILABLE)
    return failed(item_id, f"{exc.reason}: {exc}", exc.reason)
