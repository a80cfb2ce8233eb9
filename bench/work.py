"""The three kinds of work every Kafka contender runs per record (issue 30).

``noop`` decodes nothing more and returns at once; ``sleep`` waits 1 ms on I/O the sync way
(``time.sleep(0.001)``); ``asleep`` waits 1 ms the async way (``await
asyncio.sleep(0.001)``). asynctier binds them as ``bench.noop:noop``, ``bench.noop:sleep1ms``
and ``bench.noop:asleep1ms``; the peers call them in their own natural form
(``bench/kafka_peers.py``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

#: The I/O wait of the ``sleep`` and ``asleep`` functions, in seconds.
WAIT_S = 0.001

#: Work name -> what it does, as the report says it.
KINDS = {"noop": "no-op", "sleep": "1 ms sync wait (time.sleep)",
         "asleep": "1 ms async wait (await asyncio.sleep)"}


def sleep_1ms(payload: Any) -> None:
    """Wait 1 ms the synchronous way, as a function blocked on I/O does."""
    time.sleep(WAIT_S)


async def asleep_1ms(payload: Any) -> None:
    """Wait 1 ms the asynchronous way, as a coroutine awaiting I/O does."""
    await asyncio.sleep(WAIT_S)
