"""The one module a scheduler must never import unless told to allow it: importing it leaves
a mark (an environment variable in this process, and a file beside the ledger when there is
one), running it another. In-process tests read the first, tests of real processes the
file."""

import os
from pathlib import Path

os.environ["ASYNCTIER_TEST_EVIL_IMPORTED"] = "1"
_LEDGER = os.environ.get("ASYNCTIER_TEST_LEDGER")
if _LEDGER:
    Path(_LEDGER + ".imported").touch()


def run(payload: object, ctx: object) -> None:
    """Never to run."""
    if _LEDGER:
        Path(_LEDGER + ".ran").touch()
