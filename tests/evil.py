"""A module that must never be imported by the scheduler: importing it leaves a mark."""

import os
from pathlib import Path

Path(os.environ.get("ASYNCTIER_TEST_LEDGER", "/tmp/asynctier-evil") + ".imported").touch()


def boom(payload: object, ctx: object) -> None:
    """Never to run."""
    Path(os.environ.get("ASYNCTIER_TEST_LEDGER", "/tmp/asynctier-evil") + ".ran").touch()
