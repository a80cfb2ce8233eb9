"""The demo's queue workload: whole-video transcodes, a job a queue suits better than a
stream (each takes a while, and each has its own priority).

Three priority bands are enqueued at once, in one batch: creators' premieres (100),
ordinary uploads (0) and a backfill of old videos re-encoded for a new format (-100). The
tailer leases the highest priorities first, so the premieres start first. A few items find
no transcoder free on their first attempt (nacked, leased again a second later); a few
are corrupt (rejected: dead items, kept in the queue with their reason).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Mapping

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue

NAME = "transcode"
FUNCTION = "asynctier.demo.functions:transcode_video"
TENANT = "studio"
COUNT = 300
#: (priority, what the band is), highest first.
BANDS = ((100, "premieres"), (0, "uploads"), (-100, "backfill"))


def topic(settings: Settings) -> str:
    """The queue topic of this demo run (its namespace is the tenant)."""
    return f"{settings.prefix}.{NAME}"


def priority_of(item_id: int) -> int:
    """The priority band of item ``item_id`` (ids cycle through the bands)."""
    return BANDS[item_id % len(BANDS)][0]


def items(seed: int = 11) -> list[dict[str, object]]:
    """The items' payloads: ``id``, ``seconds`` of work, ``busy`` or ``corrupt`` for a few."""
    rng = random.Random(seed)
    docs: list[dict[str, object]] = []
    for i in range(COUNT):
        doc: dict[str, object] = {"id": i, "priority": priority_of(i),
                                  "seconds": round(rng.uniform(0.02, 0.08), 3)}
        roll = rng.random()
        if roll < 0.05:
            doc["busy"] = True
        elif roll < 0.06:
            doc["corrupt"] = True
        docs.append(doc)
    return docs


def expected_rejects() -> int:
    """How many items are corrupt (dead items at the end)."""
    return sum(1 for doc in items() if doc.get("corrupt"))


def bind(settings: Settings, ladder_s: tuple[float, ...]) -> Binding:
    """Bind the queue topic to the transcoder."""
    binding = Binding(NAME, Source("queue", topic(settings), lease_s=30.0), FUNCTION,
                      tenant=TENANT, priority="normal", retries=Retries(4, ladder_s),
                      execution=Execution(timeout_s=10.0)).validate()
    BindingRegistry(settings).put(binding)
    return binding


def enqueue(settings: Settings) -> int:
    """Enqueue every item in one batch (one statement per shard): all ready at once."""
    docs = items()
    with ShardedQueue.from_settings(settings, pool_size=1) as queue:
        results = queue.enqueue(TENANT, [
            NewItem(topic(settings), json.dumps(doc).encode(), id=str(doc["id"]),
                    priority=priority_of(int(str(doc["id"])))) for doc in docs])
    return sum(1 for r in results if r.created)


def dead_items(settings: Settings) -> int:
    """How many items of this run's topic are dead."""
    with ShardedQueue.from_settings(settings, pool_size=1) as queue:
        return sum(c.dead for c in queue.counts(TENANT, topic(settings)))


def median_starts(first_starts: Mapping[int, float]) -> dict[int, float]:
    """Per priority band, the median first start of its items, in seconds after the first
    item of the queue started."""
    if not first_starts:
        return {}
    origin = min(first_starts.values())
    by_band: dict[int, list[float]] = {}
    for item_id, at in first_starts.items():
        by_band.setdefault(priority_of(item_id), []).append(at - origin)
    return {band: statistics.median(times) for band, times in by_band.items()}


def in_priority_order(medians: Mapping[int, float]) -> bool:
    """True when each higher band's median start precedes the next lower band's."""
    ordered = [medians[p] for p, _ in BANDS if p in medians]
    return len(ordered) == len(BANDS) and all(a < b for a, b in itertools.pairwise(ordered))
