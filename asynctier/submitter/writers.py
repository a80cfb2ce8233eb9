"""Where accepted workloads go: a queue binding's topic, or a Kafka binding's topic.

Both answer only once the write is durable: the queue's transaction committed, or every
record's delivery confirmed by the broker with ``acks=all``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, Producer

from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError
from asynctier.platform.kafka import client_config
from asynctier.submitter.protocol import Workload

#: The Submitter's producer: every record acknowledged by all in-sync replicas, no
#: duplicates from the producer's own retries.
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "compression.type": "lz4",
}


class KafkaWriter:
    """Produces workloads and waits for each record's delivery report (topic, partition,
    offset). One producer per process; a thread serves its delivery reports."""

    def __init__(self, settings: Settings) -> None:
        self._producer = Producer({**client_config(settings), **PRODUCER_CONFIG})
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="submitter-producer",
                                        daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def write(self, topic: str, workloads: Sequence[Workload]
                    ) -> list[tuple[int, int]]:
        """Produce ``workloads`` to ``topic``; (partition, offset) of each once every one
        is delivered. Raises HandoffError when any delivery failed."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[tuple[int, int]]] = []
        for w in workloads:
            future: asyncio.Future[tuple[int, int]] = loop.create_future()
            futures.append(future)
            self._produce(topic, w, _reporter(loop, future))
        results = await asyncio.gather(*futures, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise HandoffError(f"{len(errors)} of {len(results)} record(s) to {topic} were not "
                               f"delivered: {errors[0]}")
        return [r for r in results if not isinstance(r, BaseException)]

    def _produce(self, topic: str, w: Workload, report: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, w.payload, w.key, headers=list(w.headers) or None,
                                       on_delivery=report)
                return
            except BufferError:  # the client's queue is full: the poll thread drains it
                self._stop.wait(0.01)

    def close(self) -> None:
        """Deliver what is left (10 s at most) and stop."""
        self._producer.flush(10.0)
        self._stop.set()
        self._poller.join(5.0)


def _reporter(loop: asyncio.AbstractEventLoop, future: asyncio.Future[tuple[int, int]]
              ) -> Any:
    def report(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            loop.call_soon_threadsafe(_fail, future, HandoffError(err.str()))
        else:
            loop.call_soon_threadsafe(_done, future, (msg.partition(), msg.offset()))

    return report


def _done(future: asyncio.Future[tuple[int, int]], value: tuple[int, int]) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[tuple[int, int]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
