"""Nothing stops silently, end to end: the real processes, Kafka, Redis and PostgreSQL.

A tailer made to fail (the fault hook raising in ``read``, or a fatal consume error) is
restarted within its backoff; ``asynctier bindings`` shows ``failing`` while it keeps
failing and ``running`` once it has been healthy; the restart counter moves; ``/readyz``
says not ready meanwhile; and the binding drains with nothing lost. The same for a queue
tailer and a delay tailer. ``/readyz`` fails within 2 s of SIGTERM; ``/healthz`` stays up
through a Redis outage and says why.

The restarts are made fast (``ASYNCTIER_RESTARTS``): 0.2 s doubling to 0.5 s, failing
after 5 restarts, healthy again after 3 s.
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asynctier import dev
from asynctier.platform.config import Settings
from asynctier.queue.store import QueueStore
from tests.faults.checker import succeeded
from tests.faults.harness import FUNCTION, FaultPlatform, make_docs, produce
from tests.helpers import wait_until
from tests.platform_harness import cli_in_process, committed_vs_end, free_port
from tests.queue.test_queue_e2e import enqueue

RESTARTS = "first_s=0.2,max_s=0.5,healthy_s=3,failing_after=5,failing_window_s=300"


@pytest.fixture
def plat(settings: Settings, tmp_path: Path, postgres: str) -> Iterator[FaultPlatform]:
    platform = FaultPlatform(settings, tmp_path, env={"ASYNCTIER_RESTARTS": RESTARTS,
                                                      "ASYNCTIER_QUEUE_SHARDS": postgres})
    try:
        yield platform
    finally:
        platform.stop_all()


def tailer_state(plat: FaultPlatform, binding: str) -> str:
    """The ``tailer`` column of ``asynctier bindings --json`` for ``binding``."""
    rows = json.loads(cli_in_process(plat, "bindings", "--json"))
    return str(next(row["tailer"] for row in rows if row["name"] == binding))


def http(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of ``GET http://127.0.0.1:port/path``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def not_ready(port: int) -> dict[str, Any] | None:
    """The body of ``/readyz`` when it answers 503 (else None)."""
    code, body = http(port, "/readyz")
    return body if code == 503 else None


def restarts(port: int, binding: str) -> dict[str, float]:
    """reason -> ``asynctier_tailer_restarts_total`` of ``binding`` in a process."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {s.labels["reason"]: s.value
            for family in text_string_to_metric_families(text)
            if family.name == "asynctier_tailer_restarts"
            for s in family.samples
            if s.name.endswith("_total") and s.labels["binding"] == binding}


def see_failing_then_running(plat: FaultPlatform, binding: str, port: int,
                             loop: str) -> list[str]:
    """Wait for ``failing`` (``/readyz`` not ready, naming ``loop``), then ``running``
    (``/readyz`` ready); the states seen."""
    seen: list[str] = []

    def state(want: str) -> bool:
        seen.append(tailer_state(plat, binding))
        return seen[-1].startswith(want)

    wait_until(lambda: state("failing:"), 30, f"{binding} shown failing", interval=0.2)
    code, body = http(port, "/readyz")
    assert code == 503 and body["why"][loop].startswith("failing:"), body
    wait_until(lambda: state("running"), 30, f"{binding} running again", interval=0.2)
    wait_until(lambda: http(port, "/readyz")[0] == 200, 10, "ready again")
    return seen


def all_succeeded(plat: FaultPlatform, n: int, timeout_s: float = 60) -> None:
    """Wait until ids 0..n-1 all ran to success (the ledger, not Redis)."""
    wait_until(lambda: set(range(n)) <= set(succeeded(plat.calls())), timeout_s,
               f"all {n} records succeeded", interval=0.3)


@pytest.mark.parametrize(("action", "reason"), [("raise", "InjectedFault"),
                                                ("fatal", "KafkaException")])
def test_a_failing_kafka_tailer_is_restarted_shown_failing_and_drains(
        plat: FaultPlatform, settings: Settings, unique_topic: Callable[..., str],
        action: str, reason: str) -> None:
    topic = unique_topic(partitions=2)
    plat.bind("orders", topic)
    produce(settings, topic, make_docs(300))
    plat.start("scheduler")
    port = free_port()
    plat.start_with({"ASYNCTIER_FAULT": f"{action}-read:after=3,times=6"}, "tailers",
                    "tailers", "--metrics-port", str(port))
    seen = see_failing_then_running(plat, "orders", port, "orders")
    assert any(reason in s for s in seen), seen  # the last error is shown
    produce(settings, topic, make_docs(600)[300:])
    all_succeeded(plat, 600)
    group = settings.names.group("orders")
    wait_until(lambda: len(set(committed_vs_end(settings, group, topic))) == 1, 30,
               "group lag 0")
    assert restarts(port, "orders") == {reason: 6.0}
    assert f"tailer for binding orders failed ({reason}" in plat.log_text("tailers")


def test_a_failing_queue_tailer_is_restarted_shown_failing_and_drains(
        plat: FaultPlatform, queue_store: QueueStore, queue_namespace: str) -> None:
    # a short lease: the items the failed run had under way are leased again once it
    # runs out (a tailer that failed does not give them back)
    plat.cli("bind", "jobs", "--queue", "work", "--tenant", queue_namespace, "--function",
             FUNCTION, "--lease", "5s")
    enqueue(queue_store, queue_namespace, "work", [{"id": i} for i in range(300)])
    plat.start("scheduler")
    port = free_port()
    plat.start_with({"ASYNCTIER_FAULT": "raise-read:after=2,times=6"}, "tailers",
                    "tailers", "--metrics-port", str(port))
    see_failing_then_running(plat, "jobs", port, "jobs")
    all_succeeded(plat, 300)
    wait_until(lambda: (lambda c: (c.ready, c.leased, c.dead) == (0, 0, 0))(
        queue_store.counts(queue_namespace, "work")[0]), 30, "the queue empty")
    assert restarts(port, "jobs") == {"InjectedFault": 6.0}


def test_a_failing_delay_tailer_is_restarted_shown_failing_and_drains(
        plat: FaultPlatform, settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(partitions=2)
    plat.bind("orders", topic, "--retry-ladder", "1s")
    plat.start("scheduler")
    plat.start("tailers")
    port = free_port()
    plat.start_with({"ASYNCTIER_FAULT": "raise-read:after=2,times=6"}, "delay", "delay",
                    "--metrics-port", str(port))
    produce(settings, topic, make_docs(200, failing_every=4))  # 50 go the delay path
    seen = see_failing_then_running(plat, "orders", port, "delay:1s")
    assert any(s.startswith("failing: delay:1s: InjectedFault") for s in seen), seen
    all_succeeded(plat, 200)
    names = settings.names
    for group, where in ((names.group("orders"), topic),
                         (names.delay_group("1s"), names.delay_topic("1s"))):
        wait_until(lambda g=group, t=where: len(set(committed_vs_end(settings, g, t))) == 1,
                   30, f"{group} lag 0")
    assert restarts(port, "delay:1s") == {"InjectedFault": 6.0}


def test_readyz_fails_within_two_seconds_of_sigterm_before_the_drain(
        plat: FaultPlatform, settings: Settings, unique_topic: Callable[..., str]) -> None:
    """A scheduler with a slow call under way: from SIGTERM on it is not ready, while it
    still finishes that call."""
    topic = unique_topic()
    plat.bind("slow", topic)
    port = free_port()
    plat.start("scheduler", "scheduler", "--metrics-port", str(port))
    plat.start("tailers")
    wait_until(lambda: http(port, "/readyz")[0] == 200, 30, "the scheduler ready")
    assert http(port, "/healthz") == (200, {"status": "ok", "why": {}})
    produce(settings, topic, [{"id": 0, "sleep": 6}])
    wait_until(lambda: len(plat.calls()) >= 1, 30, "the slow call started")
    plat.signal("scheduler", signal.SIGTERM)
    body = wait_until(lambda: not_ready(port), 2.0, "not ready within 2 s of SIGTERM",
                      interval=0.05)
    assert body["why"]["stopping"].startswith("stopping"), body
    assert plat.alive("scheduler")  # still draining
    assert plat.procs["scheduler"].wait(30) == 0
    assert 0 in succeeded(plat.calls())  # the call under way was finished


def test_healthz_stays_up_through_a_redis_outage_and_says_why(
        settings: Settings, tmp_path: Path) -> None:
    node = dev.start_test_redis(tmp_path / "redis")
    own = settings.with_overrides(redis_url=node.url)
    plat = FaultPlatform(own, tmp_path, env={"ASYNCTIER_RESTARTS": RESTARTS})
    try:
        port = free_port()
        plat.start("scheduler", "scheduler", "--metrics-port", str(port))
        wait_until(lambda: http(port, "/readyz")[0] == 200, 30, "ready with Redis")
        node.stop()
        body = wait_until(lambda: not_ready(port), 10, "not ready without Redis")
        assert "does not answer" in body["why"]["redis"], body
        code, body = http(port, "/healthz")
        assert code == 200 and body["status"] == "ok", body
        assert "does not answer" in body["not_ready"]["redis"], body
        node.start()
        wait_until(lambda: http(port, "/readyz")[0] == 200, 15, "ready once Redis is back")
    finally:
        plat.stop_all()
        node.stop()
