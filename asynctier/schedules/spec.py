"""A schedule as a value: when it ticks, what each tick enqueues, what a missed tick does.

Pure logic, no I/O: :class:`Schedule` checks itself (a schedule read back from PostgreSQL
is checked the same way as one a user typed), :meth:`Schedule.after` gives the first tick
after a time, and :func:`plan` decides which due ticks fire now. Cron expressions are
cronsim's, evaluated in the schedule's time zone, so daylight-saving gaps and repeats follow
its (Debian cron's) rules: a daily job in a skipped hour runs once at the gap's end, one in a
repeated hour runs once; a job every N minutes runs in both copies of a repeated hour.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from asynctier.platform.errors import ScheduleError
from asynctier.queue.items import MAX_PRIORITY, MIN_PRIORITY, check_namespace, check_topic

CatchUp = Literal["none", "last", "all"]
CATCH_UPS: tuple[CatchUp, ...] = ("none", "last", "all")
#: A tick found more than this late counts as missed (the platform was down) by default.
DEFAULT_GRACE_S = 10.0
#: ``--catch-up all`` fires at most this many missed ticks by default (the latest ones).
DEFAULT_CATCH_UP_MAX = 100
#: The most missed ticks ``--catch-up all`` may be told to fire.
MAX_CATCH_UP = 10_000
#: The shortest ``--every``: a schedule is not a busy loop.
MIN_EVERY_S = 1
#: The payload keys a tick adds (a schedule's own payload may not use them).
TICK_KEYS = ("schedule", "tick", "tick_ms")
#: The largest schedule payload (JSON text), in bytes.
MAX_PAYLOAD_BYTES = 64 * 1024
Target = Literal["queue", "kafka"]
TARGETS: tuple[Target, ...] = ("queue", "kafka")
#: The queue topic of a namespace whose items are ticks bound for Kafka topics.
OUTBOX_TOPIC = "asynctier.kafka-outbox"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Schedule:
    """One schedule: exactly one of ``cron`` (5 fields, in ``timezone``) or ``every_s``
    (whole seconds, ticks at multiples of it since the epoch); each tick enqueues one item
    on queue ``topic`` of ``namespace``, with ``payload`` (a JSON object) plus the tick's
    time, ``priority``, and an expiry ``expire_s`` after its firing (None: none).
    ``target="kafka"``: ``topic`` is a Kafka topic; the tick's item goes to the
    namespace's outbox (:data:`OUTBOX_TOPIC`) and is relayed there once
    (:mod:`asynctier.schedules.relay`)."""

    namespace: str
    name: str
    topic: str
    cron: str | None = None
    every_s: int | None = None
    timezone: str = "UTC"
    payload: str = "{}"
    priority: int = 0
    expire_s: float | None = None
    catch_up: CatchUp = "none"
    catch_up_max: int = DEFAULT_CATCH_UP_MAX
    grace_s: float = DEFAULT_GRACE_S
    target: Target = "queue"

    def __post_init__(self) -> None:
        check(self)

    @property
    def queue_topic(self) -> str:
        """The queue topic its ticks' items go to (and whose shard holds its row)."""
        return self.topic if self.target == "queue" else OUTBOX_TOPIC

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone (checked at construction)."""
        return ZoneInfo(self.timezone)

    def when(self) -> str:
        """How it ticks, as the CLI shows it."""
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.every_s}s"

    def after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms`` (epoch milliseconds)."""
        if self.every_s is not None:
            step = self.every_s * 1000
            return (t_ms // step + 1) * step
        assert self.cron is not None
        start = datetime.fromtimestamp(t_ms / 1000, UTC).astimezone(self.zone)
        for tick in CronSim(self.cron, start.replace(microsecond=0)):
            tick_ms = round(tick.timestamp() * 1000)
            if tick_ms > t_ms:
                return tick_ms
        raise ScheduleError(f"schedule {self.name!r}: cron {self.cron!r} never ticks again")

    def tick_payload(self, tick_ms: int) -> bytes:
        """The item a tick enqueues: the schedule's payload with its name and tick time."""
        doc = json.loads(self.payload)
        doc.update(schedule=self.name, tick=iso(tick_ms), tick_ms=tick_ms)
        return json.dumps(doc, separators=(",", ":")).encode()

    def item_id(self, tick_ms: int) -> str:
        """The tick's item id: the same tick always makes the same id."""
        return f"schedule:{self.name}:{iso(tick_ms)}"


@dataclass(frozen=True)
class Plan:
    """What one firing does: the ticks to enqueue, how many missed ticks it skips, and
    the schedule's next tick."""

    fire: tuple[int, ...]
    skipped: int
    next_ms: int


def plan(schedule: Schedule, next_ms: int, now_ms: int, scan_max: int = MAX_CATCH_UP) -> Plan:
    """The due ticks (``next_ms`` up to ``now_ms``) split into those on time (at most
    ``grace_s`` late: they fire) and those missed, which fire by the catch-up policy:
    ``none`` none, ``last`` the latest, ``all`` the latest ``catch_up_max``. Beyond
    ``scan_max`` due ticks the older ones are skipped uncounted past that many."""
    grace_ms = round(schedule.grace_s * 1000)
    due: list[int] = []
    tick = next_ms
    while tick <= now_ms and len(due) < scan_max:
        due.append(tick)
        tick = schedule.after(tick)
    if tick <= now_ms:  # more than scan_max due: jump to the ticks within grace
        tick = schedule.after(now_ms - grace_ms - 1)
        while tick <= now_ms:
            due.append(tick)
            tick = schedule.after(tick)
    on_time = [t for t in due if now_ms - t <= grace_ms]
    missed = [t for t in due if now_ms - t > grace_ms]
    keep = {"none": 0, "last": 1, "all": schedule.catch_up_max}[schedule.catch_up]
    caught = missed[len(missed) - keep:] if keep else []
    return Plan(tuple(caught + on_time), len(missed) - len(caught), tick)


def check(s: Schedule) -> None:
    """Every rule a schedule meets; ScheduleError saying what to fix."""
    check_namespace(s.namespace)
    if not isinstance(s.name, str) or not _NAME_RE.fullmatch(s.name):
        raise ScheduleError(f"schedule name {s.name!r} is not valid: use 1 to 100 letters, "
                            "digits, '.', '_' or '-', starting with a letter or digit")
    where = f"schedule {s.name!r}: "
    if s.target not in TARGETS:
        raise ScheduleError(f"{where}target {s.target!r} is not one of {', '.join(TARGETS)}")
    check_topic(s.topic, where)
    if s.topic == OUTBOX_TOPIC:
        raise ScheduleError(f"{where}topic {OUTBOX_TOPIC} is the platform's own: choose "
                            "another")
    if (s.cron is None) == (s.every_s is None):
        raise ScheduleError(f"{where}give exactly one of --cron or --every")
    _check_zone(s.timezone, where)
    if s.cron is not None:
        _check_cron(s.cron, where)
    elif (not isinstance(s.every_s, int) or isinstance(s.every_s, bool)
          or s.every_s < MIN_EVERY_S):
        raise ScheduleError(f"{where}--every {s.every_s!r}s is not valid: give whole seconds, "
                            f"at least {MIN_EVERY_S}s (for example 30s, 5m)")
    _check_payload(s.payload, where)
    if (not isinstance(s.priority, int) or isinstance(s.priority, bool)
            or not MIN_PRIORITY <= s.priority <= MAX_PRIORITY):
        raise ScheduleError(f"{where}priority {s.priority!r} is out of range: give an integer "
                            f"from {MIN_PRIORITY} to {MAX_PRIORITY}")
    if s.expire_s is not None:
        _check_seconds(s.expire_s, "the expiry", where, low=0.001)
    _check_seconds(s.grace_s, "the grace", where, low=0.0)
    if s.catch_up not in CATCH_UPS:
        raise ScheduleError(f"{where}--catch-up {s.catch_up!r} is not one of "
                            f"{', '.join(CATCH_UPS)}")
    if (not isinstance(s.catch_up_max, int) or isinstance(s.catch_up_max, bool)
            or not 1 <= s.catch_up_max <= MAX_CATCH_UP):
        raise ScheduleError(f"{where}--catch-up-max {s.catch_up_max!r} is not valid: give 1 "
                            f"to {MAX_CATCH_UP}")


def _check_zone(zone: str, where: str) -> None:
    try:
        if not isinstance(zone, str) or not zone:
            raise ValueError
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"{where}time zone {zone!r} is unknown: give an IANA name such as "
                            "UTC or Europe/Paris") from None


def _check_cron(cron: str, where: str) -> None:
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ScheduleError(f"{where}cron {cron!r} is not valid: give five fields, minute "
                            "hour day-of-month month day-of-week (for example '*/5 * * * *')")
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ScheduleError(f"{where}cron {cron!r} is not valid ({exc}): give five fields, "
                            "minute hour day-of-month month day-of-week") from None


def _check_payload(payload: str, where: str) -> None:
    try:
        doc: Any = json.loads(payload)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{where}the payload is not JSON ({exc}): give a JSON object, "
                            "such as '{\"kind\": \"nightly\"}'") from None
    if not isinstance(doc, dict):
        raise ScheduleError(f"{where}the payload is {type(doc).__name__}: give a JSON object "
                            "(the tick's time is added to it)")
    taken = [key for key in TICK_KEYS if key in doc]
    if taken:
        raise ScheduleError(f"{where}the payload uses {taken}, which each tick sets: rename them")
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:
        raise ScheduleError(f"{where}the payload is over {MAX_PAYLOAD_BYTES:,} bytes")


def _check_seconds(value: float, what: str, where: str, low: float) -> None:
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or not low <= value <= 365 * 86400):
        raise ScheduleError(f"{where}{what} {value!r}s is not valid: give {low:g}s to 365 days")


def iso(t_ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC (``YYYY-MM-DDTHH:MM:SSZ``; ms when not whole)."""
    moment = datetime.fromtimestamp(t_ms / 1000, UTC)
    text = moment.isoformat(timespec="milliseconds" if t_ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")
