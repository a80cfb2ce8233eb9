"""The Dramatiq peer's broker and actor, imported by ``dramatiq bench.dramatiq_app``.

Redis broker, default middleware; the actor decodes the record's JSON and calls the same
no-op as every other contender. ``BENCH_REDIS_URL`` and ``BENCH_QUEUE`` choose the broker
and queue (Dramatiq needs its broker at module level).
"""

from __future__ import annotations

import json
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.kafka_loops import noop

QUEUE = os.environ.get("BENCH_QUEUE", "bench")

broker = RedisBroker(  # type: ignore[no-untyped-call]
    url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, actor_name="bench_noop")
def run_noop(text: str) -> None:
    """The actor: decode the record, call the no-op."""
    noop(json.loads(text))
