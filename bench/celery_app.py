"""The Celery peer's app, imported by ``celery -A bench.celery_app worker``.

Redis broker, ``acks_late``, ``ignore_result``; the task decodes the record's JSON and
calls the same no-op as every other contender. The broker URL and queue come from
``BENCH_REDIS_URL`` and ``BENCH_QUEUE`` (Celery needs its app at module level).
"""

from __future__ import annotations

import json
import os

from celery import Celery  # type: ignore[import-untyped]

from bench.kafka_loops import noop


def make_app(redis_url: str, queue: str) -> Celery:
    """The Celery app the feeder and the workers share."""
    celery = Celery("bench", broker=redis_url)
    celery.conf.update(
        task_acks_late=True,
        task_ignore_result=True,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    celery.task(name="bench.noop")(run_noop)
    return celery


def run_noop(text: str) -> None:
    """The task: decode the record, call the no-op."""
    noop(json.loads(text))


app = make_app(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
               os.environ.get("BENCH_QUEUE", "bench"))
