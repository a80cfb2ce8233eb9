"""Reading a scheduler's answer: its outcomes are checked before anything is done on them.

A tailer commits offsets, acks queue items and writes delay and dead-letter records on
what a scheduler answers, so an answer is input from outside the process like any other.
Every reply is read through :func:`read_outcomes`, by every consumer: the unary submit
(:meth:`asynctier.platform.rpc.PendingCall.result`, under the tailers, the delay tailers,
the parked-key runner and ``dlq replay``) and the run stream
(:class:`asynctier.platform.stream.StreamCall`, under long work). A reply that fails a
check raises :class:`~asynctier.platform.errors.BadReply`; the caller treats it as a
failure of that scheduler (the batch is sent again, nothing is resolved on its word).

What is checked: the reply decodes; each outcome names an item of the call, and no item
twice (and, for a whole answer, every item); its status is ``ok``, ``retry`` or
``failed``; its reason is one of :data:`KNOWN_REASONS` (or none); its delay is none or
from 0 to :data:`~asynctier.platform.errors.MAX_RETRY_AFTER_S`. A scheduler that learns a
new reason must be released after the tailers that know it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from asynctier.platform import wire
from asynctier.platform.errors import MAX_RETRY_AFTER_S, BadReply
from asynctier.platform.wire import Outcome

#: The reasons a scheduler may give (``Outcome.reason``): :mod:`asynctier.platform.wire`'s.
KNOWN_REASONS = frozenset({
    wire.UNDECODABLE, wire.TOO_LARGE, wire.REJECTED, wire.FUNCTION_ERROR, wire.TIMEOUT,
    wire.MAX_ATTEMPTS, wire.BINDING_REMOVED, wire.EXPIRED, wire.UNKNOWN_SCHEMA, wire.NOT_FRAMED,
    wire.REGISTRY_UNAVAILABLE})
STATUSES = frozenset({"ok", "retry", "failed"})
#: How much of a bad value a BadReply's message shows.
_SHOWN = 80


def read_outcomes(data: bytes, expected: Collection[int], whole: bool = True) -> list[Outcome]:
    """The outcomes of one reply, checked (see the module's doc) against the ids
    ``expected``: with ``whole``, exactly one outcome for each of them (a submit call's
    answer); without, at most one each (a run stream's message, ``expected`` being the ids
    still waiting). Raises BadReply, saying what was wrong."""
    try:
        outcomes = wire.decode_outcomes(data)
    except Exception as exc:  # fastavro and the columns' unpacking raise many kinds
        raise BadReply(f"the reply does not decode ({type(exc).__name__}: "
                       f"{str(exc)[:_SHOWN]}); {len(data)} byte(s)") from None
    check_outcomes(outcomes, expected, whole)
    return outcomes


def check_outcomes(outcomes: list[Outcome], expected: Collection[int],
                   whole: bool = True) -> None:
    """Raise BadReply when ``outcomes`` are not a sound answer for the ids ``expected``
    (see :func:`read_outcomes`)."""
    ids = [o["id"] for o in outcomes]
    unique = set(ids)
    if len(unique) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)[:5]
        raise BadReply(f"it answers item(s) {twice} more than once")
    if isinstance(expected, range) and expected.step == 1:
        stray = [] if not ids or (min(ids) >= expected.start and max(ids) < expected.stop) \
            else [i for i in ids if i not in expected]
    else:
        stray = [i for i in ids if i not in expected]
    if stray:
        raise BadReply(f"it answers item(s) {sorted(stray)[:5]} that the call did not send "
                       f"or that were answered already ({len(expected)} waiting)")
    if whole and len(unique) != len(expected):
        missing = sorted(set(expected) - unique)
        raise BadReply(f"it answers {len(unique)} of {len(expected)} item(s); none for "
                       f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for o in outcomes:
        if o["status"] != "ok":
            _check_one(o)


def _check_one(o: Outcome) -> None:
    """One outcome that is not ``ok``."""
    if o["status"] not in STATUSES:
        raise BadReply(f"item {o['id']}: unknown status {str(o['status'])[:_SHOWN]!r}")
    reason = o["reason"]
    if reason is not None and reason not in KNOWN_REASONS:
        raise BadReply(f"item {o['id']}: unknown reason {reason[:_SHOWN]!r}; known: "
                       f"{', '.join(sorted(KNOWN_REASONS))} (is the scheduler newer than "
                       "this tailer?)")
    after = o["after_s"]
    if after is not None and not 0 <= after <= MAX_RETRY_AFTER_S:  # NaN fails too
        raise BadReply(f"item {o['id']}: a delay of {after!r}s, not from 0 to "
                       f"{MAX_RETRY_AFTER_S:g}")
