"""How a function's end maps to an outcome (DESIGN.md, Contracts: Function).

A return is ``ok``; ``Retry(after)`` is a retry after ``after`` seconds that spends an
attempt; ``Reject(reason)`` fails for good; any other exception retries along the ladder.
"""

from __future__ import annotations

from asynctier.platform.errors import MAX_RETRY_AFTER_S, Reject, Retry
from asynctier.platform.wire import Outcome, failed, retry

MAX_ERROR = 500


_TEXTS: dict[tuple[type[BaseException], tuple[object, ...]], str] = {}
_BASE_STR = BaseException.__str__


def error_text(exc: BaseException) -> str:
    """``ExcType: message``, cut to :data:`MAX_ERROR` characters.

    Remembered for exceptions whose text comes from string arguments alone (no ``__str__``
    of their own): a failing function tends to fail the same way for every item, and in a
    retry flood this runs once per record on the scheduler's busiest thread."""
    kind = type(exc)
    args = exc.args
    # one argument, the common case, is checked without a generator
    plain = (type(args[0]) is str if len(args) == 1 else all(type(a) is str for a in args)
             ) and kind.__str__ is _BASE_STR
    if plain:
        text = _TEXTS.get((kind, args))
        if text is not None:
            return text
    text = f"{kind.__name__}: {exc}"
    text = text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."
    if plain:
        if len(_TEXTS) >= 1024:
            _TEXTS.clear()
        _TEXTS[(kind, args)] = text
    return text


def of_exception(item_id: int, exc: BaseException) -> Outcome:
    """The outcome of a function that raised ``exc``."""
    if isinstance(exc, Retry):
        after = exc.after  # checked by Retry(), but an attribute can be set afterwards
        if after is not None and not 0 <= after <= MAX_RETRY_AFTER_S:
            return retry(item_id, f"Retry(after={after!r}) is out of range (0 to "
                                  f"{MAX_RETRY_AFTER_S:g} s); the ladder's delay is used")
        return retry(item_id, exc.reason[:MAX_ERROR], after_s=after)
    if isinstance(exc, Reject):
        return failed(item_id, exc.reason[:MAX_ERROR])
    return retry(item_id, error_text(exc))


def timed_out(item_id: int, timeout_s: float) -> Outcome:
    """The outcome of a call that ran past the binding's timeout."""
    return retry(item_id, f"timed out after {timeout_s:g}s")


def undecodable(item_id: int, reason: str) -> Outcome:
    """The outcome of a payload that does not decode: a dead letter at once."""
    return failed(item_id, f"undecodable: {reason}")
