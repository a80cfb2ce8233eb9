"""asynctier: run Python functions on the records that already sit in Kafka topics.

A function is ``def f(payload, ctx)`` or ``async def f(payload, ctx)``. Raise
:class:`Retry` to run it again later and :class:`Reject` to fail the record for good.
"""

from asynctier.platform.context import Context
from asynctier.platform.errors import AsynctierError, Reject, Retry

__all__ = ["AsynctierError", "Context", "Reject", "Retry", "__version__"]
__version__ = "0.1.0"
