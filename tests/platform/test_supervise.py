"""Supervision's bookkeeping and runners (:mod:`asynctier.platform.supervise`), the status
lines ``asynctier bindings`` shows (:mod:`asynctier.platform.status`) and the fault hook's
``raise`` action. Pure: the clock is moved by hand; no service is needed."""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import KafkaException

from asynctier.dev.faults import FaultHook, InjectedFault
from asynctier.platform import supervise
from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.platform.status import NOT_RUNNING, UNKNOWN, binding_status, worst
from asynctier.platform.supervise import RestartPolicy, Restarts, Supervisor, supervise_task
from tests.helpers import until, wait_until


class Clock:
    """A clock tests move."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_from_one_second_to_a_minute_and_resets_after_a_healthy_minute(
        ) -> None:
    clock = Clock()
    r = Restarts("orders", RestartPolicy(), clock)
    delays = []
    for _ in range(9):
        r.started()
        clock.now += 0.5  # fails half a second in, every time
        delays.append(r.failed("boom"))
        clock.now += delays[-1]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    r.started()
    clock.now += 60.0  # a healthy minute
    assert r.failed("boom again") == 1.0


def test_five_restarts_in_five_minutes_is_failing_until_a_healthy_minute() -> None:
    clock = Clock()
    r = Restarts("orders", RestartPolicy(max_s=1.0), clock)
    for n in range(5):
        r.started()
        assert r.status()[0] == "running"
        r.failed(f"KafkaException: broker gone {n}")
        assert r.failing == (n == 4)
        clock.now += 1.0
    assert r.shown() == "failing: KafkaException: broker gone 4"
    r.started()
    clock.now += 59.0
    assert r.failing  # still failing: not healthy for a minute yet
    clock.now += 1.0
    assert r.shown() == "running"


def test_failures_spread_wider_than_the_window_never_make_it_failing() -> None:
    clock = Clock()
    r = Restarts("orders", RestartPolicy(healthy_s=1e9), clock)
    for _ in range(20):
        r.started()
        r.failed("boom")
        assert not r.failing
        clock.now += 61.0  # 61 s apart: never 5 within 300 s here
        if r.count >= 4:
            break
    assert r.shown() == "restarting: boom"


def test_the_policy_reads_from_the_environment_and_refuses_nonsense() -> None:
    settings = Settings().from_env({"ASYNCTIER_RESTARTS": "first_s=0.2,max_s=2,failing_after=3"})
    assert settings.restarts == RestartPolicy(first_s=0.2, max_s=2.0, failing_after=3)
    for bad, says in (("first_s=abc", "not a number"), ("speed=3", "is not one of"),
                      ("first_s=5,max_s=1", "first_s <= max_s")):
        with pytest.raises(ConfigError, match=says):
            Settings().from_env({"ASYNCTIER_RESTARTS": bad})


FAST = RestartPolicy(first_s=0.01, max_s=0.05, healthy_s=0.5, failing_after=3)


def test_a_thread_that_raises_is_restarted_counted_and_listed_while_it_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    runs: list[int] = []
    restarts: list[tuple[str, str]] = []

    def run(stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) <= 4:
            raise InjectedFault(f"fails on run {len(runs)}")
        stop.wait()

    sup = Supervisor("orders", run, stop, what="tailer for binding orders",
                     hint="Check the broker.", policy=FAST,
                     on_restart=lambda *labels: restarts.append(labels)).start()
    try:
        wait_until(lambda: len(runs) == 5, 5, "the fifth run")
        assert restarts == [("orders", "InjectedFault")] * 4
        assert sup.restarts.shown() == "failing: InjectedFault: fails on run 4"
        assert supervise.loops()["orders"] is sup.restarts
        assert supervise.failing() == {"orders": sup.restarts.shown()}
        wait_until(lambda: sup.restarts.shown() == "running", 5, "healthy again")
    finally:
        stop.set()
        sup.join(5)
    assert not sup.thread.is_alive() and "orders" not in supervise.loops()
    text = caplog.text
    assert "tailer for binding orders failed (InjectedFault: fails on run 1)" in text
    assert "restarting it in 0.01s (restart 1). Check the broker." in text
    assert "it keeps failing" in text


def test_a_thread_that_returns_unasked_is_restarted_and_stop_ends_it() -> None:
    stop = threading.Event()
    runs: list[int] = []
    reasons: list[str] = []

    def run(stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) >= 3:
            stop.set()

    sup = Supervisor("delay:1s", run, stop, what="delay tailer 1s", policy=FAST,
                     on_restart=lambda _, reason: reasons.append(reason)).start()
    sup.join(5)
    assert len(runs) == 3 and reasons == ["returned", "returned"]
    assert sup.restarts.shown() == "stopped"


def test_an_async_task_that_raises_is_restarted() -> None:
    async def scenario() -> None:
        turns: list[int] = []
        reasons: list[str] = []

        async def loop() -> None:
            turns.append(1)
            if len(turns) < 3:
                raise ValueError("bad weight")
            await asyncio.sleep(3600)

        task = supervise_task("tenant-weights", loop, what="the tenant weights follower",
                              policy=FAST, on_restart=lambda _, r: reasons.append(r))
        await until(lambda: len(turns) == 3, 5, "the third turn")
        assert reasons == ["ValueError", "ValueError"]
        assert supervise.loops()["tenant-weights"].shown() == "running"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert "tenant-weights" not in supervise.loops()

    asyncio.run(scenario())


def test_a_one_shot_task_that_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async def write() -> None:
            raise RuntimeError("Redis said no")

        task = supervise.watch(asyncio.ensure_future(write()), "a run-once write-down")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # the done callback runs

    asyncio.run(scenario())
    assert "a run-once write-down failed: RuntimeError: Redis said no" in caplog.text


def test_a_bindings_status_is_the_worst_of_its_loops_and_its_ladders_delay_tailers() -> None:
    statuses = {"orders": "running", "orders:parked": "running", "delay:30s": "running",
                "delay:1m": "failing: KafkaException: fatal", "q": "restarting: boom"}
    assert binding_status("orders", ["30s"], statuses) == "running"
    assert binding_status("orders", ["30s", "1m"], statuses) == \
        "failing: delay:1m: KafkaException: fatal"
    assert binding_status("q", [], statuses) == "restarting: boom"
    assert binding_status("gone", [], statuses) == NOT_RUNNING
    assert binding_status("orders", [], None) == UNKNOWN
    assert worst(["running", "failing: x", "restarting: y"]) == "failing: x"


def test_the_fault_hook_raises_the_times_asked_then_lets_go() -> None:
    hook = FaultHook.from_env({"ASYNCTIER_FAULT": "raise-read:after=2,times=3"})
    hook.reached("read")  # the first read passes
    for _ in range(3):
        with pytest.raises(InjectedFault):
            hook.reached("read")
    hook.reached("read")
    hook.reached("before-rpc")
    fatal = FaultHook.from_env({"ASYNCTIER_FAULT": "fatal-read:after=1"})
    with pytest.raises(KafkaException) as raised:
        fatal.reached("read")
    assert raised.value.args[0].fatal()
    fatal.reached("read")
    assert FaultHook.from_env({"ASYNCTIER_FAULT": "raise-read:after=x"}).point is None


def test_the_demo_says_what_it_leaves_running_and_how_to_stop_it() -> None:
    from asynctier.cli.demo import left_running
    from asynctier.dev import ServiceStatus

    left = [ServiceStatus("kafka", "127.0.0.1:9092", True, True, started_now=True),
            ServiceStatus("redis", "127.0.0.1:6379", True, True)]
    said = left_running(left, ".asynctier")
    assert said.startswith("left running: kafka (127.0.0.1:9092, started now), redis "
                           "(127.0.0.1:6379, already up)")
    assert "`asynctier dev down`" in said
    assert "`ASYNCTIER_DATA_DIR=/tmp/x asynctier dev down`" in left_running(left, "/tmp/x")
    assert left_running([], ".asynctier") == ""


def test_health_says_dead_when_a_loop_stops_turning_and_not_ready_from_the_stop() -> None:
    from asynctier.platform.health import Health

    clock = Clock()
    health = Health(clock)
    stop = threading.Event()
    health.stopping_on(stop)
    beat = health.loop("main loop", max_age_s=30)
    health.ready_check("redis", lambda: "Redis at x does not answer")
    assert health.healthz() == (200, {"status": "ok", "why": {},
                                      "not_ready": {"redis": "Redis at x does not answer"}})
    clock.now += 31
    code, body = health.healthz()
    assert code == 503 and "has not turned for 31s" in body["why"]["main loop"]
    beat()
    stop.set()
    code, body = health.readyz()
    assert code == 503 and body["why"]["stopping"].startswith("stopping")
    clock.now += 100  # a long drain is not death
    assert health.healthz()[0] == 200
