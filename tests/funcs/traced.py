"""A function that starts a span of its own (it nests in the platform's ``run`` span) and
fails a record's first ``fail`` attempts; each call is written to the test's ledger with
the trace it ran in."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from opentelemetry import trace

from asynctier import Context

_lock = threading.Lock()
_tracer = trace.get_tracer("tests.funcs.traced")


def charge(payload: Any, ctx: Context) -> None:
    """Record the call in a ``charge`` span; raise while ``ctx.attempt <= payload['fail']``."""
    with _tracer.start_as_current_span("charge") as span:
        span.set_attribute("order.id", payload["id"])
        now = trace.get_current_span().get_span_context()
        line = json.dumps({"id": payload["id"], "attempt": ctx.attempt,
                           "trace": f"{now.trace_id:032x}"}) + "\n"
        with _lock, open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
            fh.write(line)
        if ctx.attempt <= payload.get("fail", 0):
            raise RuntimeError(f"card declined (attempt {ctx.attempt})")


def calls(path: Path) -> list[dict[str, Any]]:
    """Every call so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
