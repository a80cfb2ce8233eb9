"""The consumer-close watchdog and the fault hook that plays a hung ``close()`` (pure
logic; the process-level scenario is ``tests/faults/test_crashes.py``)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from asynctier.dev.faults import FaultHook
from asynctier.platform.kafka import close_consumer


def test_a_close_that_returns_is_waited_for() -> None:
    closed = threading.Event()

    def close() -> None:
        time.sleep(0.2)
        closed.set()

    assert close_consumer(close, "tailer for binding b", timeout_s=5.0)
    assert closed.is_set()


def test_a_close_that_never_returns_is_given_up_with_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR):
            assert not close_consumer(release.wait, "tailer for binding b", timeout_s=0.5)
        assert 0.5 <= time.monotonic() - started < 3.0
        assert "tailer for binding b: the Kafka consumer did not close within 0.5s" in caplog.text
    finally:
        release.set()


def test_a_close_that_raises_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def close() -> None:
        raise RuntimeError("Consumer closed")

    with caplog.at_level(logging.WARNING):
        assert close_consumer(close, "delay tailer 30s", timeout_s=5.0)
    assert "delay tailer 30s: closing the Kafka consumer failed: Consumer closed" in caplog.text


@pytest.mark.parametrize(("spec", "action", "point", "after"), [
    ("kill-before-commit:after=3", "kill", "before-commit", 3),
    ("hang-close:after=1", "hang", "close", 1),
    ("kill-mid-batch:after=0", "kill", "mid-batch", 1),
])
def test_the_fault_hook_reads_its_spec(spec: str, action: str, point: str, after: int) -> None:
    hook = FaultHook.from_env({"ASYNCTIER_FAULT": spec})
    assert (hook.action, hook.point, hook.after) == (action, point, after)


@pytest.mark.parametrize("spec", ["explode-close:after=1", "hang-nowhere:after=1",
                                  "kill-close:after=x", "kill"])
def test_a_fault_spec_not_understood_arms_nothing(spec: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        hook = FaultHook.from_env({"ASYNCTIER_FAULT": spec})
    assert hook.point is None
    assert "is not understood" in caplog.text


def test_hang_blocks_only_at_its_point_and_time() -> None:
    hook = FaultHook("close", after=2, action="hang")
    hook.reached("before-rpc")  # another point: returns
    hook.reached("close")  # the first time: returns
    second = threading.Thread(target=hook.reached, args=("close",), daemon=True)
    second.start()
    second.join(0.5)
    assert second.is_alive()  # the second time blocks for good


def test_stopping_gives_up_on_a_stuck_tailer_and_says_where_it_was(
        caplog: pytest.LogCaptureFixture) -> None:
    """A tailer thread stuck in the Kafka client while stopping (seen in CI: inside the
    rebalance that the stop started) must not keep the process from exiting."""
    from types import SimpleNamespace

    from asynctier.tailers.manager import TailerManager

    release = threading.Event()

    def stuck_in_the_client() -> None:
        release.wait()

    manager = TailerManager.__new__(TailerManager)
    manager.follower = SimpleNamespace(stop=lambda: None)  # type: ignore[assignment]
    manager._lock = threading.Lock()
    manager._stopping = threading.Event()
    manager._pause_loop = SimpleNamespace(join=lambda timeout_s: None)  # type: ignore[assignment]
    manager.pauses = SimpleNamespace(close=lambda: None)  # type: ignore[assignment]
    thread = threading.Thread(target=stuck_in_the_client, daemon=True)
    thread.start()
    stop = threading.Event()
    manager._running = {"orders": SimpleNamespace(stop=stop, thread=thread)}  # type: ignore[dict-item]
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR):
            manager.stop(timeout_s=0.5)
        assert time.monotonic() - started < 3.0 and stop.is_set()
        assert "tailer for binding orders did not stop within 0.5s" in caplog.text
        assert "stuck_in_the_client" in caplog.text  # where it was
        assert manager._running == {}
    finally:
        release.set()
