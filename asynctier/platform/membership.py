"""Scheduler membership in Redis: who is alive, where, and how loaded.

Each scheduler beats every ``interval_s``, about 1 s (:mod:`asynctier.scheduler.heartbeat`):
its address goes into the sorted set ``<prefix>:{schedulers}`` scored by its expiry (Redis
``TIME`` + ``ttl_s``, about 5 s), its load (items queued or running) into the hash
``<prefix>:{schedulers}:load``, and its region, capacity and tier (JSON ``{"region": ...,
"capacity": ..., "tier": ...}``, the tier only for a scheduler kept for one: ``run
scheduler --tier``) into the hash ``<prefix>:{schedulers}:place``; the three share one hash
tag (one Redis Cluster slot). A scheduler that stops beating (killed, hung, cut off) drops
out within the TTL. Tailers read the live ones with :class:`SchedulerDirectory`, which picks
the schedulers of the tailers' tier (:func:`for_tier`), places each call in a region among
them (:mod:`asynctier.platform.placement`) and falls back to ``settings.schedulers`` when
Redis cannot be reached or no scheduler is registered.

This module is the membership's shared half: its keys and the directory every caller of a
scheduler reads.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

import redis

from asynctier.platform import metrics
from asynctier.platform.binding import PRIORITIES
from asynctier.platform.config import DEFAULT_REGION, Settings
from asynctier.platform.errors import ServiceError
from asynctier.platform.placement import NO_HOME, SPILL, Choice, Placement, Spot
from asynctier.platform.redis_client import sync_client
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.scripts import lua

log = logging.getLogger(__name__)

#: The live schedulers and their loads (``lua/membership_live.lua``).
LIVE: Final = lua("membership_live")


#: How often a tailer says (at most) that it is sending calls out of its region.
SPILL_LOG_EVERY_S = 30.0


def member_keys(settings: Settings) -> tuple[str, str, str]:
    """The Redis keys of membership: the members' sorted set, their loads' hash and their
    places' hash (region and capacity)."""
    names = settings.names
    return (names.redis_tagged_key("schedulers"), names.redis_tagged_key("schedulers", "load"),
            names.redis_tagged_key("schedulers", "place"))


@dataclass(frozen=True)
class Member:
    """A live scheduler: its load (items queued or running), region, capacity (the items
    it holds; 0 when it registered none, as an older scheduler does) and the tier it is
    kept for (None: every tier)."""

    address: str
    load: int
    region: str = DEFAULT_REGION
    capacity: int = 0
    tier: str | None = None

    @property
    def spot(self) -> Spot:
        """The member as placement sees it."""
        return Spot(self.address, self.region, self.load, self.capacity)


def place_json(region: str, capacity: int, tier: str | None = None) -> str:
    """What a scheduler registers as its place."""
    doc: dict[str, Any] = {"region": region, "capacity": capacity}
    if tier is not None:
        doc["tier"] = tier
    return json.dumps(doc, separators=(",", ":"))


def for_tier(members: list[Member], tier: str | None) -> list[Member]:
    """The schedulers a tailer of ``tier`` sends to: those kept for its tier while one has
    room; when every one of them is full, those too that take every tier (where the tier
    is still ordered by its weight); with none kept for it, those that take every tier,
    else any (a call is never left without a scheduler because of its tier). A tailer of
    every tier (``tier`` None) sends to those that take every tier while one lives."""
    own = [m for m in members if tier is not None and m.tier == tier]
    if own and not all(m.spot.full for m in own):
        return own
    return own + [m for m in members if m.tier is None] or members


#: What a registered address must look like: ``host:port`` (an IPv6 host in brackets).
ADDRESS_RE: Final = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")

_said_bad: set[str] = set()  # the bad entries already logged, so each is said once


def _place(raw: Any) -> tuple[str, int, str | None]:
    """(region, capacity, tier) of a registered place; the defaults (every tier) when
    absent or unreadable: a tier this version does not know is read as every tier."""
    if not raw:
        return DEFAULT_REGION, 0, None
    try:
        doc = json.loads(_text(raw))
        region = doc.get("region") or DEFAULT_REGION
        if not isinstance(region, str):
            raise TypeError(f"region {region!r} is not a string")
        tier = doc.get("tier")
        return (region, max(0, int(doc.get("capacity", 0))),
                tier if tier in PRIORITIES else None)
    except (ValueError, TypeError, AttributeError):
        return DEFAULT_REGION, 0, None


def _member(address: Any, load: Any, place: Any) -> Member | None:
    """One member as read from Redis, or None (logged once) when its address or load is
    not what a scheduler registers: a caller must never dial a made-up address."""
    text = _text(address)
    try:
        if not ADDRESS_RE.match(text) or int(text.rsplit(":", 1)[1]) > 65535:
            raise ValueError(f"address {text[:80]!r} is not host:port")
        count = int(_text(load))
        if count < 0:
            raise ValueError(f"load {count} is below 0")
    except ValueError as exc:
        if text not in _said_bad:
            _said_bad.add(text)
            log.error("scheduler membership: the entry %r is ignored: %s. Something other "
                      "than a scheduler wrote there; remove it from the membership keys "
                      "(asynctier schedulers lists the live ones)", text[:80], exc)
        return None
    return Member(text, count, *_place(place))


def _members(reply: Any) -> list[Member]:
    """The members of a :data:`LIVE` reply (address, load, place triples); the entries
    that are not a scheduler's are left out."""
    if not isinstance(reply, list) or len(reply) % 3:
        raise ServiceError(f"the membership script answered {str(reply)[:80]!r}, not "
                           "(address, load, place) triples")
    found = (_member(a, n, p) for a, n, p in zip(reply[::3], reply[1::3], reply[2::3],
                                                 strict=True))
    return sorted((m for m in found if m is not None), key=lambda m: (m.region, m.address))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def live_members(settings: Settings, script: Any = None) -> list[Member]:
    """The live schedulers with their loads; ServiceError when Redis cannot answer.

    ``script`` is the :data:`LIVE` script registered on a client (one is made if None).
    """
    client = None
    if script is None:
        client = sync_client(settings.redis_url, socket_timeout=1.0,
                             socket_connect_timeout=1.0)
        script = client.register_script(LIVE)
    try:
        return _members(script(keys=list(member_keys(settings))))
    except redis.RedisError as exc:
        raise ServiceError(f"Redis at {settings.redis_display} did not answer: {exc}") from exc
    finally:
        if client is not None:
            client.close()


def live_schedulers(settings: Settings) -> list[str]:
    """Addresses of the live schedulers; ServiceError when Redis cannot answer."""
    return [m.address for m in live_members(settings)]


#: How long a tailer's directory keeps the live schedulers it read, in seconds.
DIRECTORY_CACHE_S = 1.0


class SchedulerDirectory:
    """Live schedulers for tailers, cached ``cache_s``; ``settings.schedulers`` when Redis
    fails or none is registered. Pass :meth:`addresses` and :meth:`place` to
    SchedulerClient: :meth:`place` sends each call to the schedulers of ``tier`` (those
    of the tailers' tier: :func:`for_tier`), and among them keeps it in the tailer's
    region while it can (``settings.region``, ``spill_share``, ``spill_window``,
    ``spill_order``)."""

    def __init__(self, settings: Settings, cache_s: float = DIRECTORY_CACHE_S,
                 tier: str | None = None) -> None:
        self.settings = settings
        self.cache_s = cache_s
        self.tier = tier
        self._client = sync_client(settings.redis_url, socket_timeout=0.5,
                                   socket_connect_timeout=0.5)
        self._live = self._client.register_script(LIVE)
        self._cached: list[Member] = []
        self._until = 0.0
        self._failing = False
        self._lock = threading.Lock()
        self.placement = Placement(settings.region, settings.spill_share,
                                   settings.spill_window, settings.spill_order)
        self._away_logged = -SPILL_LOG_EVERY_S
        self._was_away = False

    def members(self) -> list[Member]:
        """The live schedulers (empty when Redis fails or none is registered)."""
        with self._lock:
            if time.monotonic() >= self._until:
                self._cached = self._read()
                self._until = time.monotonic() + self.cache_s
            return list(self._cached)

    def addresses(self) -> list[str]:
        """The live schedulers' addresses (never empty when any is configured)."""
        return [m.address for m in self.members()] or list(self.settings.schedulers)

    def place(self, down: Collection[str] = ()) -> list[str]:
        """The schedulers the next call goes to (``down``: addresses the caller leaves
        alone for now): of the tailers' tier, its own region's while they have room, else
        per :class:`Placement`. The configured schedulers when none is registered."""
        members = self.members()
        if not members:
            return [a for a in self.settings.schedulers if a not in down]
        up = for_tier([m for m in members if m.address not in down], self.tier)
        choice = self.placement.choose(m.spot for m in up)
        if choice is None:
            return []
        metrics.count_region_call(choice.region, choice.reason)
        self._say(choice)
        return choice.addresses

    def _say(self, choice: Choice) -> None:
        """Tell the operator when calls leave the region, and when they are home again."""
        if not choice.away:
            if self._was_away and self.placement.cap.away == 0:
                log.info("region %s: calls are back home", self.settings.region)
                self._was_away = False
            return
        now = time.monotonic()
        if not self._was_away or now - self._away_logged >= SPILL_LOG_EVERY_S:
            self._away_logged = now
            self._was_away = True
            if choice.reason == SPILL:
                log.warning("region %s is full (every live scheduler at capacity): sending "
                            "up to %g%% of calls to region %s; add schedulers to %s or raise "
                            "[scheduler] max_queued_items", self.settings.region,
                            self.settings.spill_share * 100, choice.region,
                            self.settings.region)
            elif choice.reason == NO_HOME:
                log.warning("region %s has no live scheduler: sending every call to region "
                            "%s until one is back (start `asynctier run scheduler` with "
                            "region = %r)", self.settings.region, choice.region,
                            self.settings.region)

    def _read(self) -> list[Member]:
        try:
            live = live_members(self.settings, self._live)
        except ServiceError as exc:
            if not self._failing:
                log.warning("scheduler membership unavailable (%s); using the configured "
                            "schedulers %s", exc, ", ".join(self.settings.schedulers))
            self._failing = True
            return []
        if self._failing:
            log.info("scheduler membership is back: %d live scheduler(s)", len(live))
            self._failing = False
        return live

    def close(self) -> None:
        """Close the Redis connection."""
        self._client.close()


def default_client(settings: Settings, wait_for_scheduler: bool = True,
                   tier: str | None = None) -> SchedulerClient:
    """A SchedulerClient on the live schedulers (Redis membership; those of ``tier`` first,
    :func:`for_tier`), falling back to the configured list: the delay path keeps working
    when Redis is down. Without ``wait_for_scheduler`` a call raises SchedulerUnavailable
    when none is known at all."""
    directory = SchedulerDirectory(settings, tier=tier)
    return SchedulerClient(directory.addresses, wait_for_scheduler=wait_for_scheduler,
                           security=settings.rpc, place=directory.place)
