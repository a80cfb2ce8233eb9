"""Where a tailer sends a call: its own region first, another only when it must (pure logic).

A tailer lives in a region (``[asynctier] region``); schedulers register theirs with their
load and capacity (:mod:`asynctier.platform.membership`). For each call,
:meth:`Placement.choose` picks a region and the schedulers there to send to:

* **home**: the home region has a live scheduler with free capacity (load under its
  capacity): the call stays home, to those schedulers. Nothing leaves while home has room.
* **spill**: every live home scheduler is full. The call goes to the first other region
  (``spill_order``, then the rest by name) with a scheduler that has room, as long as the
  calls sent away stay within the cap: at most ``floor(share * window)`` of the last
  ``window`` home-or-spill decisions. Past the cap (or with no room anywhere) it stays home
  and waits there (the scheduler holds it back until room frees).
* **no_home**: the home region has no live scheduler at all: the call goes away, to the
  first region in the same order with room (else with any live scheduler), whatever the
  cap; these decisions are not counted in the cap's window. As soon as a home scheduler
  is live again, calls are home again.

A scheduler that registers no capacity (an older version) is never counted full.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

HOME: Final = "home"
SPILL: Final = "spill"
NO_HOME: Final = "no_home"
#: Why a call went where it went (the ``reason`` label of the calls-by-region metric).
REASONS: Final = (HOME, SPILL, NO_HOME)


@dataclass(frozen=True)
class Spot:
    """A live scheduler as placement sees it: where it is and how loaded."""

    address: str
    region: str
    load: int
    capacity: int  # 0: unknown (never counted full)

    @property
    def full(self) -> bool:
        """True when its queued and running items reached its capacity."""
        return self.capacity > 0 and self.load >= self.capacity


@dataclass(frozen=True)
class Choice:
    """Where one call goes: a region, its schedulers to send to, and why."""

    region: str
    addresses: list[str]
    reason: str

    @property
    def away(self) -> bool:
        """True when the call leaves the tailer's region."""
        return self.reason != HOME


class SpillCap:
    """At most ``floor(share * window)`` of the last ``window`` decisions went away."""

    def __init__(self, share: float, window: int) -> None:
        if not 0.0 <= share <= 1.0 or window < 1:
            raise ValueError("share must be within 0..1 and window at least 1")
        self.window = window
        self.budget = math.floor(share * window + 1e-9)
        self._recent: deque[bool] = deque()
        self._away = 0

    @property
    def away(self) -> int:
        """Decisions that went away among the last ``window``."""
        return self._away

    def allows(self) -> bool:
        """True when one more call sent away keeps the last ``window`` within budget."""
        leaving = len(self._recent) == self.window and self._recent[0]
        return self._away - int(leaving) + 1 <= self.budget

    def record(self, away: bool) -> None:
        """Count one home-or-spill decision."""
        if len(self._recent) == self.window and self._recent.popleft():
            self._away -= 1
        self._recent.append(away)
        self._away += int(away)


def region_order(home: str, regions: Iterable[str], preferred: Sequence[str]) -> list[str]:
    """The other regions in the order a call spills to them: ``preferred`` first (as
    listed), then the rest by name; ``home`` never."""
    others = set(regions) - {home}
    first = [r for r in dict.fromkeys(preferred) if r in others]
    return first + sorted(others - set(first))


class Placement:
    """Chooses the region of each call of one tailer process (thread-safe)."""

    def __init__(self, home: str, share: float, window: int,
                 order: Sequence[str] = ()) -> None:
        self.home = home
        self.order = tuple(order)
        self.cap = SpillCap(share, window)
        self._lock = threading.Lock()

    def choose(self, spots: Iterable[Spot]) -> Choice | None:
        """Where the next call goes; None when no scheduler is live anywhere."""
        by_region: dict[str, list[Spot]] = {}
        for spot in spots:
            by_region.setdefault(spot.region, []).append(spot)
        home = by_region.get(self.home, [])
        with self._lock:
            if not home:
                return self._no_home(by_region)
            room = [s.address for s in home if not s.full]
            if room:
                self.cap.record(False)
                return Choice(self.home, room, HOME)
            spill = self._spill(by_region) if self.cap.allows() else None
            self.cap.record(spill is not None)
            return spill or Choice(self.home, [s.address for s in home], HOME)

    def _spill(self, by_region: dict[str, list[Spot]]) -> Choice | None:
        for region in region_order(self.home, by_region, self.order):
            room = [s.address for s in by_region[region] if not s.full]
            if room:
                return Choice(region, room, SPILL)
        return None

    def _no_home(self, by_region: dict[str, list[Spot]]) -> Choice | None:
        order = region_order(self.home, by_region, self.order)
        if not order:
            return None
        for region in order:
            room = [s.address for s in by_region[region] if not s.full]
            if room:
                return Choice(region, room, NO_HOME)
        first = order[0]
        return Choice(first, [s.address for s in by_region[first]], NO_HOME)
