"""``release.hand_off``: a record that ``produce()`` refuses at once is written again later,
like an unconfirmed one; the caller gets HandoffError only when stopping (pure logic)."""

from __future__ import annotations

import threading

import pytest

from asynctier.delay_streams.release import hand_off
from asynctier.platform.errors import HandoffError


class _Handoff:
    def __init__(self) -> None:
        self.confirmed = 0

    def confirm(self) -> None:
        self.confirmed += 1


def test_a_refused_produce_is_retried_then_confirmed() -> None:
    tries = []

    def action() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise HandoffError("could not produce to x: Message size too large")
        return "retry"

    handoff = _Handoff()
    assert hand_off(handoff, [action], threading.Event(), "test", retry_s=0.01) == ["retry"]  # type: ignore[arg-type]
    assert len(tries) == 3 and handoff.confirmed == 1


def test_a_refused_produce_raises_only_when_stopping() -> None:
    def action() -> str:
        raise HandoffError("could not produce to x: Message size too large")

    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    with pytest.raises(HandoffError):
        hand_off(_Handoff(), [action], stop, "test", retry_s=0.02)  # type: ignore[arg-type]
