"""asynctier: run Python functions on the records that already sit in Kafka topics.

A function is ``def f(payload, ctx)`` or ``async def f(payload, ctx)``. Raise
:class:`Retry` to run it again later and :class:`Reject` to fail the record for good.
"""

from typing import Any

from asynctier.platform.context import Context
from asynctier.platform.errors import AsynctierError, Reject, Retry

__all__ = ["AsyncClient", "AsynctierError", "Client", "Context", "Reject", "Retry",
           "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``Client`` and ``AsyncClient`` (the SDK) are imported on first use: a function's
    module that imports ``Retry`` does not load gRPC."""
    if name in ("Client", "AsyncClient"):
        from asynctier import client

        return getattr(client, name)
    raise AttributeError(f"module 'asynctier' has no attribute {name!r}")
