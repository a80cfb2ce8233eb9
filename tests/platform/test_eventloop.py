"""The scheduler's and Submitter's event loop: uvloop unless told otherwise, and a clear
error for a setting that names neither."""

from __future__ import annotations

import asyncio

import pytest

from asynctier.platform import eventloop
from asynctier.platform.errors import ConfigError


async def _kind() -> str:
    await asyncio.sleep(0.001)  # a timer runs on it
    return eventloop.name()


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.chosen() == "uvloop"
    assert eventloop.run(_kind()) == "uvloop"


def test_the_standard_loop_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.run(_kind()) == "asyncio"


def test_a_loop_nobody_knows_is_refused_with_the_choices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "tokio")
    with pytest.raises(ConfigError, match="ASYNCTIER_EVENT_LOOP='tokio': expected one of "
                                          "uvloop, asyncio"):
        eventloop.run(_kind())
