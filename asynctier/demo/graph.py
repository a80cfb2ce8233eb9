"""The demo's time- and dependency-triggered work.

- **The upload graph** (the seeds' upload flow): per upload, three encodes (360p, 720p,
  1080p) run in parallel, and its publish waits for all three (``after=``). In a few
  uploads the 720p encode fails for good: their publish dies ``parent_failed``.
- **A nightly-style schedule**, fired every ``EVERY_S`` seconds instead of nightly, on a
  queue topic of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules import Schedule, ScheduleStore

MODULE = "asynctier.demo.functions"
TENANT = "studio"
ENCODE, PUBLISH, NIGHTLY = "encode", "publish", "nightly"
UPLOADS = 12
#: The uploads whose 720p encode fails for good.
BROKEN = frozenset({3, 8})
RESOLUTIONS = (360, 720, 1080)
EVERY_S = 2
_FUNCTIONS = {ENCODE: "encode_resolution", PUBLISH: "publish_video",
              NIGHTLY: "nightly_report"}


def topic(settings: Settings, name: str) -> str:
    """The queue topic of ``name`` in this demo run."""
    return f"{settings.prefix}.{name}"


def schedule_name(settings: Settings) -> str:
    """The run's schedule (schedules are named per namespace: the prefix keeps runs apart)."""
    return f"{settings.prefix}.{NIGHTLY}"


def bind(settings: Settings, ladder_s: tuple[float, ...]) -> list[Binding]:
    """Bind the encode, publish and nightly queue topics."""
    registry = BindingRegistry(settings)
    bindings = []
    for name, function in _FUNCTIONS.items():
        binding = Binding(name, Source("queue", topic(settings, name), lease_s=30.0),
                          f"{MODULE}:{function}", tenant=TENANT, priority="normal",
                          retries=Retries(3, ladder_s), execution=Execution(timeout_s=10.0)
                          ).validate()
        registry.put(binding)
        bindings.append(binding)
    return bindings


def start(settings: Settings) -> None:
    """Enqueue the upload graphs and add the schedule."""
    items: list[NewItem] = []
    for video in range(UPLOADS):
        encodes = [NewItem(topic(settings, ENCODE), json.dumps(
            {"video": video, "resolution": r,
             "broken": video in BROKEN and r == 720}).encode(), id=f"{video}-{r}p")
            for r in RESOLUTIONS]
        items += encodes
        items.append(NewItem(topic(settings, PUBLISH), json.dumps({"video": video}).encode(),
                             id=f"{video}-publish",
                             after=[(e.topic, e.id) for e in encodes if e.id]))
    with ShardedQueue.from_settings(settings, pool_size=1) as queue:
        queue.enqueue(TENANT, items)
        ScheduleStore(queue).add(Schedule(
            namespace=TENANT, name=schedule_name(settings), topic=topic(settings, NIGHTLY),
            every_s=EVERY_S, payload='{"report": "nightly"}'), replace=True)


@dataclass(frozen=True)
class Progress:
    """Where the graph and the schedule are."""

    published: int
    parent_failed: int
    publishes_left: int
    ticks: int

    @property
    def finished(self) -> bool:
        """Every publish ran or died with its encode, and the schedule fired twice."""
        return (self.publishes_left == 0 and self.parent_failed == len(BROKEN)
                and self.ticks >= 2)


def progress(settings: Settings) -> Progress:
    """Read the publish topic's counts and the schedule's firings."""
    with ShardedQueue.from_settings(settings, pool_size=1) as queue:
        counts = queue.counts(TENANT, topic(settings, PUBLISH))
        info = ScheduleStore(queue).get(TENANT, schedule_name(settings))
    c = counts[0] if counts else None
    left = 0 if c is None else c.ready + c.delayed + c.leased + c.waiting
    dead = 0 if c is None else c.dead
    return Progress(published=UPLOADS - left - dead, parent_failed=dead,
                    publishes_left=left, ticks=0 if info is None else info.fired)


def stop(settings: Settings) -> Progress:
    """Remove the run's schedule (its items already enqueued stay); where things were."""
    done = progress(settings)
    with ShardedQueue.from_settings(settings, pool_size=1) as queue:
        ScheduleStore(queue).remove(TENANT, schedule_name(settings))
    return done
