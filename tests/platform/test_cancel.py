"""cancel_and_wait ends a looping task even when Python 3.11's ``asyncio.wait_for`` loses
the cancel (CPython gh-86296): the race that once hung a scheduler's stop, through the
membership heartbeat's Redis calls (redis-py writes through ``wait_for``)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from asynctier.platform.cancel import cancel_and_wait


class WaitForLoop:
    """A heartbeat-like task: loops over ``wait_for`` on futures the test completes."""

    def __init__(self) -> None:
        self.waiting: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        self.rounds = 0

    async def run(self) -> None:
        while True:
            future = asyncio.get_running_loop().create_future()
            await self.waiting.put(future)
            await asyncio.wait_for(future, 10)
            self.rounds += 1


async def _finishing(loop: WaitForLoop) -> asyncio.Future[None]:
    """The future the task waits on through ``wait_for``; the caller completes it and
    cancels the task in the same loop turn: the race."""
    future = await loop.waiting.get()
    await asyncio.sleep(0)  # the task is inside wait_for
    return future


LOSES_CANCELS = sys.version_info < (3, 12)


@pytest.mark.skipif(not LOSES_CANCELS, reason="wait_for keeps the cancel since 3.12")
def test_python_3_11_wait_for_loses_a_cancel_that_lands_as_the_call_finishes() -> None:
    """The control: one plain cancel does not stop such a task on this Python."""
    async def main() -> None:
        loop = WaitForLoop()
        task = asyncio.create_task(loop.run())
        (await _finishing(loop)).set_result(None)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        assert not done, "the cancel was kept: the race this module guards against is gone"
        assert loop.rounds == 1
        task.cancel()  # not at the racy moment this time
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())


def test_cancel_and_wait_ends_a_task_whose_cancel_was_lost() -> None:
    async def main() -> None:
        loop = WaitForLoop()
        task = asyncio.create_task(loop.run())
        (await _finishing(loop)).set_result(None)
        async with asyncio.timeout(5):
            await cancel_and_wait(task, every_s=0.05)  # its first cancel is the racy one
        assert task.cancelled()
        if LOSES_CANCELS:
            assert loop.rounds == 1, "the first cancel was not lost: the race was not run"
    asyncio.run(main())


def test_cancel_and_wait_returns_at_once_for_tasks_that_end_on_the_first_cancel() -> None:
    async def main() -> None:
        tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in range(3)]
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        started = asyncio.get_running_loop().time()
        await cancel_and_wait(*tasks, done, every_s=5)
        assert asyncio.get_running_loop().time() - started < 1
        assert all(t.cancelled() for t in tasks) and not done.cancelled()
    asyncio.run(main())
