"""A module with an import side effect: the scheduler must never import it unless allowed."""

import os

os.environ["ASYNCTIER_TEST_EVIL_IMPORTED"] = "1"


def run(payload: object, ctx: object) -> None:
    """Never to be run."""
