"""An example function module for the image built FROM asynctier's (see the Dockerfile
beside it): ``asynctier bind greetings --topic names --function greetings:hello``."""

from __future__ import annotations

from typing import Any

from asynctier import Context


async def hello(payload: dict[str, Any], ctx: Context) -> str:
    """Greet the name in the record."""
    return f"hello, {payload['name']}"
