"""The scheduler's tuning knobs, one typed value with units in the names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from asynctier.platform.config import Settings
from asynctier.scheduler.queues import DEFAULT_TIER_WEIGHTS
from asynctier.scheduler.runtime import CPU_BOUND_ITEM_S

#: Worker tasks beside ``workers`` that take only a tenant's trickle (in its tier, one
#: chunk queued and none running: :meth:`~.queues.FairQueue.pop_trickle`): it does not
#: wait for a flood's chunk to end before its own starts, and a backlog never holds them.
SPARE_WORKERS = 1


@dataclass(frozen=True)
class SchedulerOptions:
    """How many chunks run at once, how much may queue, how work is shared.

    ``workers`` chunk runners run at once, and :data:`SPARE_WORKERS` more for trickles;
    sync functions get as many threads. At most
    ``max_queued_items`` items wait in the queue (a submit call waits for room beyond
    that). A submitted batch is cut into chunks sized so that one chunk takes about
    ``chunk_target_s`` (between ``min_chunk_items`` and ``max_chunk_items``, learned from
    the binding's measured time per item). ``tier_weights`` share the workers between
    ``urgent``, ``normal`` and ``batch``; ``tenant_weights`` between the tenants of a tier
    (1 when not named). A binding with a concurrency cap keeps at most
    ``capped_chunks_per_binding`` chunks in this scheduler, so that chunks waiting for its
    slots cannot hold every worker. Within a tier and tenant, chunks run earliest
    deadline first; a binding without ``--start-within`` is ordered as if due
    ``default_start_within_s`` after its items arrived (:mod:`.deadlines`).
    """

    workers: int = 8
    max_queued_items: int = 20_000
    max_chunk_items: int = 256
    min_chunk_items: int = 8
    chunk_target_s: float = 0.02
    tier_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    capped_chunks_per_binding: int = 2
    default_start_within_s: float = 60.0
    unknown_binding_retry_s: float = 5.0
    admission_error_retry_s: float = 5.0
    stop_grace_s: float = 30.0
    heartbeat_interval_s: float = 1.0
    membership_ttl_s: float = 5.0
    #: A sync function measured CPU-bound that takes at least this much CPU an item runs
    #: in worker processes (:mod:`.runtime`); None keeps every binding in its threads.
    cpu_bound_item_s: float | None = CPU_BOUND_ITEM_S
    #: The tier this scheduler is kept for (``run scheduler --tier``), registered in the
    #: membership so that tailers of that tier send to it first; None: every tier.
    tier: str | None = None

    @property
    def threads(self) -> int:
        """Sync chunks that may run at once: the workers' and the spare workers'."""
        return self.workers + SPARE_WORKERS


def options_from_settings(settings: Settings,
                          base: SchedulerOptions | None = None) -> SchedulerOptions:
    """``base`` (default :class:`SchedulerOptions`) with the config file's ``[scheduler]``
    table applied: ``workers``, ``max_queued_items``, ``stop_grace``, ``tier_weights``
    (tiers not named keep theirs) and ``cpu_bound_item_ms``."""
    base = base or SchedulerOptions()
    weights = {**base.tier_weights, **settings.tier_weights}
    workers = settings.scheduler_workers or base.workers
    queued = settings.scheduler_max_queued or base.max_queued_items
    cpu_bound = base.cpu_bound_item_s
    if settings.cpu_bound_item_ms is not None:
        cpu_bound = settings.cpu_bound_item_ms / 1000 if settings.cpu_bound_item_ms else None
    grace = settings.scheduler_stop_grace_s or base.stop_grace_s
    return replace(base, workers=workers, tier_weights=weights, max_queued_items=queued,
                   cpu_bound_item_s=cpu_bound, stop_grace_s=grace)
