"""Which records of a binding's partitions no tailer can have sent before: they are fresh,
and run without waiting for their run-once claim (docs/design.md, Run once off the path).

Per partition, Redis keeps a **sent mark** (``{once:<binding>}:sent:<topic>/<partition>``,
a hash: ``mark``, ``owner``): records below it may have been sent to a scheduler. A tailer
given the partition takes the mark (and becomes its owner); before it sends a record at or
past the mark it raises it, :data:`LEAP` offsets ahead, so one write covers many batches.
A record below the mark it took is guarded (claimed before it runs, as a copy read again
must be); one at or past it is fresh. A partition without a mark was never sent from
when its binding is fresh from its start (bound by a release with marks): all its records
are fresh. Else (a binding bound before the marks, or a mark that does not read) it takes
the log's end as its mark: what was there may have been sent.
A raise refused (another tailer took the mark since: this one lost the partition without
knowing) or Redis away leaves the partition's records guarded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import RedisError

from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.redis_client import sync_client
from asynctier.platform.scripts import lua
from asynctier.tailers.source import TP

log = logging.getLogger(__name__)

#: Offsets a raise covers past the batch that asked for it.
LEAP = 10_000
#: Redis waits (seconds): a tailer does not hang on a Redis that does not answer.
REDIS_TIMEOUT_S = 5.0
REDIS_CONNECT_S = 2.0
TAKE = lua("sent_take")
RAISE = lua("sent_raise")


class SentMarks:
    """The sent marks of one binding's partitions, owned by one tailer session."""

    def __init__(self, settings: Settings, binding: Binding, client: Any = None) -> None:
        self.names = settings.names
        self.binding = binding.name
        self.fresh_from_start = binding.fresh_from_start
        self.redis = client or sync_client(settings.redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                           socket_connect_timeout=REDIS_CONNECT_S)
        self.owner = uuid.uuid4().hex
        self.fresh_from: dict[TP, int] = {}  # records at or past it are fresh
        self.marks: dict[TP, int] = {}  # the mark as this owner last wrote or took it
        self._take = self.redis.register_script(TAKE)
        self._raise = self.redis.register_script(RAISE)

    @staticmethod
    def for_binding(settings: Settings, binding: Binding) -> SentMarks | None:
        """The marks of ``binding``'s partitions; None when its records are never claimed
        (``--idempotent``) or must not run before their claim (``--redis-policy
        fail_closed``)."""
        if binding.execution.idempotent or binding.limits.redis_policy != "fail_open":
            return None
        return SentMarks(settings, binding)

    def key(self, tp: TP) -> str:
        """The mark's Redis key."""
        return self.names.once_key(self.binding, "sent", f"{tp[0]}/{tp[1]}")

    def take(self, tps: Iterable[TP], end_of: Callable[[TP], int]) -> None:
        """Partitions assigned: take their marks (``end_of``: a partition's log end, the
        mark of one whose mark does not read, or that has none and whose binding is not
        fresh from its start)."""
        for tp in tps:
            self.forget([tp])
            try:
                mark = int(self._take(keys=[self.key(tp)], args=[self.owner]))
                if mark == -1 and self.fresh_from_start:
                    mark = 0  # never sent from
                elif mark < 0:
                    if mark == -2:
                        log.warning("binding %s: the sent mark %s is not an offset; taking the "
                                    "log's end instead (what is there now is claimed before "
                                    "it runs)", self.binding, self.key(tp))
                    mark = end_of(tp)
            except Exception as exc:  # Redis or the broker away: nothing is fresh
                log.warning("binding %s: could not take the sent mark of %s/%s (%s); its "
                            "records are claimed before they run until it is assigned again",
                            self.binding, tp[0], tp[1], exc)
                continue
            self.fresh_from[tp] = self.marks[tp] = mark

    def forget(self, tps: Iterable[TP]) -> None:
        """Partitions revoked or lost: none of their records is fresh here any more."""
        for tp in tps:
            self.fresh_from.pop(tp, None)
            self.marks.pop(tp, None)

    def fresh_start(self, tp: TP, last: int) -> int | None:
        """The offset from which ``tp``'s records up to ``last`` (about to be sent) are
        fresh, the mark raised past ``last`` first; None when none of them is."""
        start = self.fresh_from.get(tp)
        if start is None or last < start:
            return None
        if last >= self.marks[tp]:
            new = last + 1 + LEAP
            try:
                raised = self._raise(keys=[self.key(tp)], args=[self.owner, new])
            except RedisError as exc:
                log.warning("binding %s: could not raise the sent mark of %s/%s (%s); these "
                            "records are claimed before they run", self.binding, tp[0], tp[1],
                            exc)
                return None
            if not raised:
                log.warning("binding %s: another tailer took the sent mark of %s/%s; this one "
                            "sends its records as copies (claimed before they run)",
                            self.binding, tp[0], tp[1])
                self.forget([tp])
                return None
            self.marks[tp] = new
        return start
