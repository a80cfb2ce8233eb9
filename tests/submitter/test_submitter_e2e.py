"""The Submitter end to end: real PostgreSQL, Kafka and Redis, the real processes.

Workloads go through ``asynctier run submitter`` (SDK or ``asynctier submit``) to a queue
binding or a Kafka binding bound to ``tests.faults.funcs:run``, whose ledger says what ran.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from asynctier import Client
from asynctier.client import BindingNotFound, InvalidWorkload
from asynctier.platform.config import Settings
from asynctier.platform.status import read_statuses
from asynctier.submitter.protocol import Result, Workload
from tests.faults.checker import succeeded
from tests.helpers import wait_until
from tests.submitter_harness import SubmitterPlatform


@pytest.fixture
def plat(settings: Settings, tmp_path: Path, postgres: str) -> Iterator[SubmitterPlatform]:
    platform = SubmitterPlatform(settings, tmp_path, [postgres])
    try:
        yield platform
    finally:
        platform.stop_all()


def doc(i: int, **extra: object) -> bytes:
    """The ledger function's payload for id ``i``."""
    return json.dumps({"id": i, **extra}).encode()


def wait_ran(plat: SubmitterPlatform, ids: set[int], timeout_s: float) -> None:
    """Wait until every id of ``ids`` succeeded."""
    wait_until(lambda: ids <= set(succeeded(plat.calls())), timeout_s,
               f"the {len(ids)} accepted workloads ran", interval=0.5)


def test_accepted_workloads_run_and_refused_ones_do_not(
        plat: SubmitterPlatform, queue_namespace: str) -> None:
    """Two callers submit 2,000 workloads to a queue binding, one in ten invalid (a
    priority out of range): the valid ones are accepted and run once each; the invalid
    ones are refused with a reason and never run; an id given twice is a duplicate."""
    plat.bind_queue("q", "work", queue_namespace)
    plat.start("scheduler")
    plat.start("tailers")
    plat.start_submitter()
    client = plat.client()
    got: dict[int, Result] = {}

    def caller(base: int) -> None:
        loads = [Workload(doc(i), priority=5000 if i % 10 == 0 else i % 100, id=f"w{i}")
                 for i in range(base, base + 1000)]
        for r in client.submit_many("q", loads):
            got[base + r.position] = r

    threads = [threading.Thread(target=caller, args=(b,)) for b in (0, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == 2000
    invalid = {i for i, r in got.items() if r.status == "invalid"}
    accepted = {i for i, r in got.items() if r.status == "accepted"}
    assert invalid == {i for i in range(2000) if i % 10 == 0}
    assert accepted == set(range(2000)) - invalid
    assert all("priority 5000 is out of range" in (got[i].reason or "") for i in invalid)
    assert all(got[i].id == f"w{i}" for i in accepted)
    again = client.submit("q", doc(1), id="w1")
    assert again.status == "duplicate" and again.id == "w1"
    wait_ran(plat, accepted, 120)
    runs = succeeded(plat.calls())
    assert not set(runs) & invalid
    assert set(runs.values()) == {1}
    client.close()


def test_kafka_binding_answers_partition_and_offset(plat: SubmitterPlatform) -> None:
    """A Kafka binding: records written with their key and headers (acks=all), each
    answered with its topic, partition and offset; every one of them ran."""
    plat.bind("k", "kin", "--create-topic", "3")
    plat.start("scheduler")
    plat.start("tailers")
    plat.start_submitter()
    with plat.client() as client:
        assert isinstance(client, Client)  # the SDK as ``from asynctier import Client``
        results = client.submit_many("k", [doc(i) for i in range(300)], key=b"user-1",
                                     headers=[("trace", b"abc")])
        assert [r.status for r in results] == ["accepted"] * 300
        assert {r.topic for r in results} == {"kin"}
        assert len({r.partition for r in results}) == 1  # one key: one partition
        offsets = [r.offset for r in results]
        assert offsets == sorted(offsets) and len(set(offsets)) == 300
        with pytest.raises(InvalidWorkload, match="a priority applies to queue bindings"):
            client.submit("k", doc(999), priority=3)
        with pytest.raises(InvalidWorkload, match=r"a parent \(after\) applies to queue"):
            client.submit("k", doc(998), after=["x"])
        with pytest.raises(BindingNotFound, match="binding 'nope' does not exist"):
            client.submit("nope", doc(1))
    wait_ran(plat, set(range(300)), 120)
    assert not {998, 999} & set(succeeded(plat.calls()))
    # the Submitter says it is ready where the console and the CLI read the processes
    line = f"submitter 127.0.0.1:{plat.submitter_ports['submitter']}"
    wait_until(lambda: (read_statuses(plat.settings) or {}).get(line) == "running", 10,
               "the Submitter's status line")
    plat.stop("submitter")
    wait_until(lambda: line not in (read_statuses(plat.settings) or {}), 10,
               "a stopped Submitter's line gone")


def test_submit_cli_prints_a_summary_with_line_numbers(
        plat: SubmitterPlatform, queue_namespace: str) -> None:
    """``asynctier submit q < lines``: accepted, duplicate and invalid (with the line
    numbers) counted; exit 1 because some were invalid; the accepted ones ran."""
    plat.bind_queue("q", "work", queue_namespace)
    plat.start("scheduler")
    plat.start("tailers")
    plat.start_submitter()
    lines = [json.dumps({"payload": {"id": i}, "id": f"c{i}"}) for i in range(50)]
    lines[7] = json.dumps({"payload": "not json {", "id": "c7"})
    lines[20] = json.dumps({"payload": {"id": 20}, "id": "c1"})  # c1 again: duplicate
    done = plat.cli("submit", "q", "--envelope", input="\n".join(lines) + "\n", check=False)
    assert done.returncode == 1, done.stderr
    assert "48 accepted, 1 duplicate, 1 invalid, 0 throttled" in done.stdout
    assert "line 8: invalid: workload 7: the payload does not decode" in done.stdout
    wait_ran(plat, set(range(50)) - {7, 20}, 120)
    assert not {7, 20} & set(succeeded(plat.calls()))


def test_a_killed_submitter_loses_nothing_it_accepted_and_the_sdk_moves_on(
        plat: SubmitterPlatform, queue_namespace: str) -> None:
    """Two Submitters, two callers sending batches of 100; one Submitter is SIGKILLed
    mid-stream: every call still gets answered (by the other), and every workload answered
    accepted (or duplicate: sent again after the lost answer, it has an id) ran."""
    plat.bind_queue("q", "work", queue_namespace)
    plat.start("scheduler")
    plat.start("tailers")
    plat.start_submitter("s1")
    plat.start_submitter("s2")
    client = plat.client(deadline_s=60.0)
    got: dict[int, Result] = {}
    half = threading.Event()

    def caller(base: int) -> None:
        for at in range(base, base + 3000, 100):
            loads = [Workload(doc(i), id=f"k{i}") for i in range(at, at + 100)]
            for r in client.submit_many("q", loads):
                got[at + r.position] = r
            if len(got) >= 2000:
                half.set()

    threads = [threading.Thread(target=caller, args=(b,)) for b in (0, 3000)]
    for t in threads:
        t.start()
    assert half.wait(120)
    plat.kill("s1")
    for t in threads:
        t.join(180)
    assert not plat.alive("s1")
    assert len(got) == 6000
    assert {r.status for r in got.values()} <= {"accepted", "duplicate"}
    wait_ran(plat, set(got), 180)
    client.close()


@pytest.mark.slow
def test_50k_workloads_from_four_callers_half_queue_half_kafka(
        plat: SubmitterPlatform, queue_namespace: str) -> None:
    """50,000 workloads through the SDK, four concurrent callers, half to a queue binding
    and half to a Kafka binding, one in fifty invalid: every accepted workload ran, none
    of the refused ones did."""
    plat.bind_queue("q", "work", queue_namespace)
    plat.bind("k", "kin", "--create-topic", "4")
    plat.start("scheduler")
    plat.start("tailers")
    plat.start_submitter("s1")
    plat.start_submitter("s2")
    client = plat.client(deadline_s=120.0)
    got: dict[int, Result] = {}

    def caller(base: int, binding: str) -> None:
        for at in range(base, base + 12_500, 500):
            # one in fifty carries a priority of 5000: out of range for the queue, and
            # no priority applies to a Kafka binding; its payload would run if written
            loads = [Workload(doc(i), priority=None if i % 50 else 5000)
                     for i in range(at, at + 500)]
            for r in client.submit_many(binding, loads):
                got[at + r.position] = r

    threads = [threading.Thread(target=caller, args=(b, "q" if b < 25_000 else "k"))
               for b in (0, 12_500, 25_000, 37_500)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert len(got) == 50_000
    accepted = {i for i, r in got.items() if r.status == "accepted"}
    assert accepted == {i for i in range(50_000) if i % 50}
    wait_ran(plat, accepted, 600)
    assert not {i for i in range(0, 50_000, 50)} & set(succeeded(plat.calls()))
    client.close()


def test_with_the_platform_stopped_the_backlog_cap_throttles_until_it_drains(
        plat: SubmitterPlatform, queue_namespace: str) -> None:
    """``run submitter --max-backlog 200``, no scheduler or tailers: once 200 items wait,
    new workloads are throttled; the platform started, the backlog drains and the SDK's
    retries get them accepted, and every accepted workload ran."""
    plat.bind_queue("q", "work", queue_namespace)
    plat.start_submitter("submitter", "--max-backlog", "200")
    with plat.client(deadline_s=0.0) as client:
        first = client.submit_many("q", [doc(i) for i in range(200)])
        assert [r.status for r in first] == ["accepted"] * 200
        late = wait_until(lambda: (r := client.submit("q", doc(200))).status == "throttled"
                          and r, 15, "the Submitter sees the backlog")
        assert "over the cap of 200" in (late.reason or "")
    plat.start("scheduler")
    plat.start("tailers")
    with plat.client(deadline_s=120.0) as client:
        after = client.submit_many("q", [doc(i) for i in range(200, 300)])
    assert [r.status for r in after] == ["accepted"] * 100
    wait_ran(plat, set(range(300)), 120)
