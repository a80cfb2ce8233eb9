"""A tailer started before any scheduler is known (none registered in Redis, none
configured) keeps its batch and sends it once one comes up: it must not stop for good."""

from __future__ import annotations

import logging
import threading

import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.wire import Outcome
from tests.helpers import wait_until
from tests.scheduler_harness import items, running_scheduler

NOOP = Binding("noop", Source("kafka", "noop"), "tests.funcs.basic:noop")


def test_a_batch_sent_while_no_scheduler_is_known_runs_once_one_registers(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    known: list[str] = []
    client = SchedulerClient(lambda: list(known), call_timeout_s=30)
    stop = threading.Event()
    got: list[list[Outcome]] = []
    try:
        call = client.submit(items("noop", 3))  # raised SchedulerUnavailable before
        waiter = threading.Thread(target=lambda: got.append(call.result(stop)), daemon=True)
        waiter.start()
        wait_until(lambda: "no scheduler is configured or registered" in caplog.text, 10,
                   "the client said that no scheduler is known")
        with running_scheduler(settings, [NOOP]) as sched:
            known.append(sched.address)
            waiter.join(30)
            assert not waiter.is_alive(), "the batch never reached the scheduler"
    finally:
        stop.set()
        client.close()
    assert sorted((o["id"], o["status"]) for o in got[0]) == [(0, "ok"), (1, "ok"), (2, "ok")]
    said = [r for r in caplog.records if "no scheduler is configured" in r.getMessage()]
    assert len(said) == 1, "said once, not at every try"
    assert "asynctier run scheduler" in said[0].getMessage()


def test_stopping_while_no_scheduler_is_known_leaves_the_batch_unresolved() -> None:
    client = SchedulerClient(lambda: [], call_timeout_s=30)
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    try:
        with pytest.raises(SchedulerUnavailable):
            client.submit(items("noop", 2)).result(stop)
    finally:
        timer.cancel()
        client.close()
