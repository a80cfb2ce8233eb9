"""Functions and an in-test scheduler for the delay-stream and dead-letter tests.

Functions write to the same ledger as :mod:`tests.funcs.ledger` (``ASYNCTIER_TEST_LEDGER``):

- :func:`fixed` is :func:`tests.funcs.ledger.record` after the bug was fixed: it records the call
  (its source marked ``fixed|``) and succeeds whatever the payload asks (used to show
  ``dlq replay`` after a fix).

:class:`LocalScheduler` serves the real submit RPC (:func:`rpc.submit_handler`) from a
thread of the test process and runs functions by binding name, so the delay tailers and
``dlq replay`` can be tested before, or apart from, the real scheduler.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from asynctier import Context, Reject, Retry
from asynctier.platform import wire
from asynctier.platform.rpc import submit_handler
from tests.funcs import ledger

Function = Callable[[Any, Context], Any]


#: Source prefix of the ledger lines written by :func:`fixed`.
FIXED = "fixed|"


def fixed(payload: Any, ctx: Context) -> None:
    """Record the call in the ledger (source ``fixed|<source>``) and succeed."""
    ledger._write(f"{payload['id']} {ctx.attempt} {time.time():.6f} {FIXED}{ctx.source}\n")


def _context(item: wire.Item) -> Context:
    return Context(binding=item["binding"], key=item["key"],
                   headers=tuple((h["name"], h["value"] or b"") for h in item["headers"]),
                   source=item["source_ref"], attempt=item["attempt"],
                   record_time=item["record_time_ms"] / 1000.0, deadline=time.time() + 30)


def run_item(fn: Function, item: wire.Item) -> wire.Outcome:
    """Run ``fn`` on one item (JSON payload) and turn what happened into an Outcome."""
    try:
        fn(json.loads(item["payload"] or b"null"), _context(item))
    except Retry as exc:
        return wire.retry(item["id"], exc.reason, exc.after)
    except Reject as exc:
        return wire.failed(item["id"], exc.reason)
    except Exception as exc:
        return wire.retry(item["id"], f"{type(exc).__name__}: {exc}")
    return wire.ok(item["id"])


class LocalScheduler:
    """A gRPC scheduler in a thread: ``functions`` maps binding name -> function."""

    def __init__(self, functions: Mapping[str, Function]) -> None:
        self.functions = dict(functions)
        self.calls = 0
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Any = None

    async def _submit(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        items = wire.decode_items(request)
        outcomes = []
        for item in items:
            fn = self.functions.get(item["binding"])
            outcomes.append(wire.failed(item["id"], f"unknown binding {item['binding']}")
                            if fn is None else run_item(fn, item))
        return wire.encode_outcomes(outcomes)

    async def _start(self) -> int:
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((submit_handler(self._submit),))
        port = int(self._server.add_insecure_port("127.0.0.1:0"))
        await self._server.start()
        return port

    def start(self) -> str:
        """Serve; returns ``host:port``."""
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.address = f"127.0.0.1:{port}"
        return self.address

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
