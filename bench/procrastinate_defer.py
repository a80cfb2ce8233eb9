"""``python -m bench.procrastinate_defer N BATCH [TASK]``: defer N no-op jobs.

Jobs go through Procrastinate's own batch API (``Task.batch_defer_async``, one
``INSERT`` of BATCH jobs per call), each with the Kafka scenarios' ~100-byte record as its
arguments, built inside the timed loop. Prints the seconds it took (the last line).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from bench.procrastinate_app import app
from bench.records import record


async def defer(n: int, batch: int, task_name: str) -> float:
    """Seconds to defer ``n`` jobs of ``task_name``, ``batch`` per call."""
    task = app.tasks[task_name]
    async with app.open_async():
        started = time.monotonic()
        for first in range(0, n, batch):
            await task.batch_defer_async(*(json.loads(record(i, time.time()))
                                           for i in range(first, min(n, first + batch))))
        return time.monotonic() - started


def main(argv: list[str]) -> int:
    """Defer and print the seconds."""
    n, batch = int(argv[0]), int(argv[1])
    task_name = argv[2] if len(argv) > 2 else "noop"
    print(f"{asyncio.run(defer(n, batch, task_name)):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
