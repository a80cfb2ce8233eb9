"""Stopping background tasks for good, even when Python 3.11 loses a cancel.

On Python 3.11, ``asyncio.wait_for`` returns the inner result instead of raising when a
cancel lands just as the inner call finishes (CPython gh-86296, fixed in 3.12). redis-py
wraps every socket write of its asyncio client in ``wait_for`` when a socket timeout is
set, so a task cancelled during a Redis call can carry on as if nothing happened. A task
that loops (a heartbeat, a worker) then runs forever, and whoever awaits it waits forever:
a scheduler once hung on its stop that way. :func:`cancel_and_wait` cancels again until
the tasks have ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

#: How long a cancelled task gets to end before it is cancelled again.
RECANCEL_S = 1.0


async def cancel_and_wait(*tasks: asyncio.Future[Any], every_s: float = RECANCEL_S) -> None:
    """Cancel ``tasks`` and return once every one has ended (their results are dropped).

    A task still running ``every_s`` after its cancel is cancelled again (and logged at
    debug level): the lost-cancel race needs the cancel to land at one exact moment, so the
    next one ends it.
    """
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=every_s)
        for task in pending:
            log.debug("task %s did not end after its cancel; cancelling it again", task)
            task.cancel()
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("task %s had failed before it was stopped: %r", task, task.exception())
