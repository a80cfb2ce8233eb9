"""A function that writes each payload it is given, as JSON, to the test's ledger file
(``ASYNCTIER_TEST_LEDGER``): tests read back the shape a payload was decoded to."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from asynctier import Context

_lock = threading.Lock()


def keep(payload: Any, ctx: Context) -> None:
    """Append ``payload`` (and the record's key) as one JSON line."""
    key = None if ctx.key is None else ctx.key.decode("utf-8", "replace")
    line = json.dumps({"key": key, "payload": payload}, sort_keys=True) + "\n"
    with _lock, open(os.environ["ASYNCTIER_TEST_LEDGER"], "a") as fh:
        fh.write(line)


def kept(path: Path) -> dict[str, Any]:
    """Every payload kept so far, by its record's key."""
    if not path.exists():
        return {}
    docs = [json.loads(line) for line in path.read_text().splitlines() if line]
    return {doc["key"]: doc["payload"] for doc in docs}
