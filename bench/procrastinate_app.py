"""Procrastinate as a peer of asynctier's queue: its app and the no-op task.

The workers run ``procrastinate --app=bench.procrastinate_app.app worker ...``; the
database is the one named by ``BENCH_PG_DSN`` (the same PostgreSQL as asynctier's queue).
The task is a plain (synchronous) function, like ``bench.noop:noop``: Procrastinate runs
it in a thread of its worker's event loop.
"""

from __future__ import annotations

import os
from typing import Any

from procrastinate import App, PsycopgConnector

from bench.kafka_loops import noop as _noop

app = App(connector=PsycopgConnector(conninfo=os.environ.get("BENCH_PG_DSN", "")))


@app.task(name="noop", queue="bench")
def noop(**record: Any) -> None:
    """Do nothing with the job's arguments (the decoded record)."""
    _noop(record)


@app.task(name="noop_async", queue="bench")
async def noop_async(**record: Any) -> None:
    """The same as an ``async def`` (no thread hop in the worker)."""
    _noop(record)
