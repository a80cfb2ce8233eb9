"""Tenant quotas: items per minute and per UTC day, charged once per record.

A quota lives in Redis under ``<prefix>:{tenant:<tenant>}:quota`` (hash ``per_minute``,
``per_day``; a missing field means no limit on that window) and is set with
``asynctier quota set``. The usage of the current windows lives under
``<prefix>:{tenant:<tenant>}:quota-used`` and what was charged under
``<prefix>:{tenant:<tenant>}:charges:<binding>:<window>``: one hash tag, so one script call
touches one Redis Cluster slot, and every key it touches is passed in its ``KEYS``.

:class:`RedisQuota` charges a chunk in one round trip (:data:`~.scripts.CHARGE_QUOTA`):
the items that fit are charged and admitted, the rest come back with the seconds until
their window resets (the dispatcher delays them without spending an attempt). Each charged
item is a field (its ``source_ref``) of its binding's hash for the current charge window
of ``charge_ttl_s``, kept until the next window ends, so a record read again after a crash
is admitted without being charged twice. A tenant without a quota costs one round trip per
``recheck_s`` (1 s), not one per chunk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from asynctier.platform.binding import Binding
from asynctier.platform.durations import DAY_S, MINUTE_S
from asynctier.platform.errors import ServiceError
from asynctier.platform.names import Names
from asynctier.platform.redis_client import AsyncRedis
from asynctier.platform.wire import Item
from asynctier.scheduler.limits.bad_values import BadValues
from asynctier.scheduler.limits.scripts import CHARGE_QUOTA, QUOTA_AND_TOKENS

log = logging.getLogger(__name__)

#: A tenant found without a quota is not asked about again for this long.
DEFAULT_RECHECK_S = 1.0
#: Charges are remembered this long at least (twice at most) by default: a record re-read
#: after a crash comes back within minutes, and one field per charged item must not pile
#: up for days.
DEFAULT_CHARGE_TTL_S = 3600
#: What the script answers first when Redis' charge window is not one it was given keys of.
_SKEW = 2


@dataclass(frozen=True)
class Quota:
    """A tenant's quota; ``None`` is no limit on that window."""

    per_minute: int | None = None
    per_day: int | None = None

    def __post_init__(self) -> None:
        for value in (self.per_minute, self.per_day):
            if value is not None and value < 1:
                raise ValueError("a quota is a positive number of items (omit it for none)")

    def to_json(self) -> dict[str, int | None]:
        """``{"per_minute": N, "per_day": N}``."""
        return {"per_minute": self.per_minute, "per_day": self.per_day}


@dataclass(frozen=True)
class Usage:
    """Items charged in the current minute and the current UTC day."""

    minute: int
    day: int


class Quotas(NamedTuple):
    """The quotas read: those that are good, and why each other one was refused."""

    good: dict[str, Quota]
    refused: dict[str, str]


class QuotaStore:
    """Reads and writes tenants' quotas (the ``asynctier quota`` commands)."""

    def __init__(self, client: AsyncRedis, names: Names,
                 clock: Callable[[], int] | None = None) -> None:
        self._client = client
        self._names = names
        self._clock = clock  # epoch ms, a clock tests move; Redis TIME when None

    def key(self, tenant: str) -> str:
        """The Redis key of a tenant's quota."""
        return self._names.tenant_key(tenant, "quota")

    def usage_key(self, tenant: str) -> str:
        """The Redis key of a tenant's usage in the current windows."""
        return self._names.tenant_key(tenant, "quota-used")

    async def set(self, tenant: str, quota: Quota) -> None:
        """Replace a tenant's quota (windows left ``None`` become unlimited)."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self.key(tenant))
            for name, value in quota.to_json().items():
                if value is not None:
                    pipe.hset(self.key(tenant), name, value)
            await pipe.execute()

    async def get(self, tenant: str) -> Quota | None:
        """A tenant's quota, or None when it has none."""
        raw = await self._client.hgetall(self.key(tenant))
        return _quota(raw) if raw else None

    async def all(self) -> Quotas:
        """Every tenant that has a quota: those that read well, and why each other one is
        refused (one bad hash must not hide the others)."""
        head, tail = self.key("\n").split("\n")
        found: dict[str, Quota] = {}
        refused: dict[str, str] = {}
        async for key in self._client.scan_iter(match=self.key("*"), count=500):
            tenant = as_text(key)[len(head):-len(tail)]
            try:
                quota = await self.get(tenant)
            except ValueError as exc:
                refused[tenant] = str(exc)
                continue
            if quota is not None:
                found[tenant] = quota
        return Quotas(dict(sorted(found.items())), dict(sorted(refused.items())))

    async def usage(self, tenant: str) -> Usage:
        """What the tenant used in the current minute and day (by Redis ``TIME``, or the
        clock given)."""
        if self._clock is None:
            seconds, _micros = await self._client.time()
        else:
            seconds = self._clock() // 1000
        raw = await self._client.hmget(self.usage_key(tenant), ["m", "mc", "d", "dc"])
        minute, day = seconds // MINUTE_S, seconds // DAY_S
        m, mc, d, dc = (_whole(v) for v in raw)
        return Usage(minute=(mc or 0) if m == minute else 0, day=(dc or 0) if d == day else 0)


class RedisQuota:
    """Charges chunks of items to their tenant's quota, in one round trip each.

    A tenant found without a quota is remembered for ``recheck_s``: its chunks then cost no
    round trip at all, and a quota set for it applies within ``recheck_s``. The windows are
    those of Redis ``TIME`` unless ``clock`` (epoch ms; a clock tests move) is given. A
    quota field that is not a whole number >= 1 counts as no limit on its window, and is
    said once, with its key and the command that fixes it (:mod:`.bad_values`).
    """

    def __init__(self, client: AsyncRedis, names: Names, charge_ttl_s: int = DEFAULT_CHARGE_TTL_S,
                 recheck_s: float = DEFAULT_RECHECK_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 clock: Callable[[], int] | None = None) -> None:
        self._names = names
        self._store = QuotaStore(client, names, clock)
        self._charge = client.register_script(CHARGE_QUOTA)
        self._combined = client.register_script(QUOTA_AND_TOKENS)
        self._ttl_s = charge_ttl_s
        self._recheck_s = recheck_s
        self._monotonic = monotonic
        self._no_quota_until: dict[str, float] = {}
        self._clock = clock
        self._wall = wall if clock is None else (lambda: clock() / 1000)
        self._skew = 0  # Redis' charge window minus this clock's, as last learned
        self._bad = BadValues(log)

    def charges_key(self, binding: Binding, window: int) -> str:
        """The hash of what ``binding`` was charged in charge window ``window`` (field:
        source reference; under its tenant's tag)."""
        return self._names.tenant_key(binding.tenant, "charges", binding.name, str(window))

    def known_free(self, tenant: str) -> bool:
        """Whether ``tenant`` was found without a quota less than ``recheck_s`` ago (its
        chunks cost no round trip)."""
        return self._no_quota_until.get(tenant, 0.0) > self._monotonic()

    async def charge(self, binding: Binding, items: Sequence[Item]) -> dict[int, float]:
        """Charge what fits; ``{item id: seconds until it may run}`` for the rest."""
        if not items or self.known_free(binding.tenant):
            return {}
        over, _ = await self._run(binding, items, self._charge, None)
        return over

    async def charge_and_take(self, binding: Binding, items: Sequence[Item], bucket: str,
                              take: list[float]) -> tuple[dict[int, float], list[Any]]:
        """:meth:`charge`, and in the same call take the tokens of the items admitted from
        the bucket ``bucket`` (``take``: its rate, burst and spare wanted; see
        :data:`~.scripts.QUOTA_AND_TOKENS`, one Redis server only): the items over quota,
        and the bucket's answer."""
        return await self._run(binding, items, self._combined, (bucket, take))

    async def _run(self, binding: Binding, items: Sequence[Item], script: Any,
                   take: tuple[str, list[float]] | None) -> tuple[dict[int, float], list[Any]]:
        """Call ``script`` with the charge windows' keys of this clock; asked again once
        with Redis' window when that is another."""
        tenant = binding.tenant
        refs = join_refs([item["source_ref"] for item in items])
        mine = int(self._wall() // self._ttl_s)
        first = mine + self._skew - 2
        for _ in range(2):
            keys = [self._store.key(tenant), self._store.usage_key(tenant),
                    *(self.charges_key(binding, w) for w in range(first, first + 4))]
            args: list[Any] = [self._ttl_s, first, refs]
            if take is not None:
                keys.append(take[0])
                args += [self._clock() if self._clock is not None else "", *take[1]]
            elif self._clock is not None:
                args.append(self._clock())
            reply = await script(keys=keys, args=args)
            flat, taken = (reply[0], reply[1]) if take is not None else (reply, [])
            self._said(tenant, as_text(flat[1]))
            if int(flat[0]) != _SKEW:
                break
            self._skew = int(flat[2]) - mine
            first = int(flat[2]) - 2
        else:
            raise ServiceError(
                f"quota of tenant {tenant}: Redis' clock (TIME) moved to another charge "
                "window twice within one call; check the clocks of the Redis server and of "
                "this scheduler")
        if not int(flat[0]):
            self._no_quota_until[tenant] = self._monotonic() + self._recheck_s
            return {}, taken
        self._no_quota_until.pop(tenant, None)
        return {items[int(flat[i]) - 1]["id"]: int(flat[i + 1]) / 1000
                for i in range(2, len(flat), 2)}, taken

    def _said(self, tenant: str, refused: str) -> None:
        """Say each value the script refused, once (see :mod:`.bad_values`)."""
        quota_key, usage_key = self._store.key(tenant), self._store.usage_key(tenant)
        fields = dict(line.split("=", 1) for line in refused.split("\n") if line)
        for field in _QUOTA_FIELDS:
            if field not in fields:
                self._bad.good(quota_key, field)
            else:
                self._bad.refused(
                    quota_key, field, fields[field], "not a whole number >= 1 (the tenant "
                    "has no limit on that window until it is fixed)",
                    f"fix it with `asynctier quota set {tenant} --{field.replace('_', '-')} N`"
                    " (and the other windows it has: set replaces the quota)", tenant=tenant)
        for field in _USAGE_FIELDS:
            if field in fields:
                self._bad.refused(usage_key, field, fields[field], "not a whole number >= 0 "
                                  "(counted as 0, and written anew by the next charge)",
                                  "nothing to do, or delete the key", tenant=tenant)

#: The fields of a tenant's quota hash, and those of its usage hash the script checks.
_QUOTA_FIELDS: Final = ("per_minute", "per_day")
_USAGE_FIELDS: Final = ("mc", "dc")


def escape_ref(ref: str) -> str:
    """A source reference that holds no newline, one to one: unchanged when it holds
    neither ``%`` nor a newline, else percent-escaped (and then it holds a ``%``)."""
    if "%" not in ref and "\n" not in ref:
        return ref
    return ref.replace("%", "%25").replace("\n", "%0A")


def join_refs(refs: list[str]) -> str:
    """The references of a chunk as one argument, one per line (escaped when needed)."""
    joined = "\n".join(refs)
    if "%" in joined or joined.count("\n") != len(refs) - 1:
        joined = "\n".join(escape_ref(ref) for ref in refs)
    return joined


def as_text(value: Any) -> str:
    """A Redis reply (bytes or str) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _whole(raw: Any) -> int | None:
    """A count or window id as read from Redis: None when missing or not a whole number
    >= 0 (the script refuses those too, and writes them anew)."""
    if raw is None:
        return None
    try:
        value = int(as_text(raw))
    except ValueError:
        return None
    return value if value >= 0 else None


def _quota(raw: dict[Any, Any]) -> Quota:
    """A quota as read from Redis; ValueError, naming the field, when a field is not a
    whole number >= 1 (the scheduler then applies no limit on that window)."""
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
    values: dict[str, int | None] = {}
    for name in _QUOTA_FIELDS:
        text = fields.get(name)
        value = _whole(text) if text is not None else None
        if text is not None and not value:
            raise ValueError(f"{name} is {text[:40]!r}, not a whole number >= 1")
        values[name] = value
    return Quota(**values)
