"""The Submitter's checks and overload protection, on a Submitter served in this process
(real PostgreSQL, Kafka and Redis; bindings given, not read from the registry)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
import redis
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from asynctier.client import Client
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Payload, Source
from asynctier.platform.binding_source import StaticBindings
from asynctier.platform.config import Settings
from asynctier.queue.store import QueueStore
from asynctier.submitter.capacity import EnqueueCapacity
from asynctier.submitter.protocol import METHOD, RETRY_AFTER_KEY, Call, Workload, encode_call
from asynctier.submitter.server import serve_submitter
from asynctier.submitter.service import SubmitterOptions
from tests.helpers import MinuteClock, wait_until

AVRO_SCHEMA = json.dumps({"type": "record", "name": "Job", "fields": [
    {"name": "n", "type": "long"}]})


@dataclass
class Served:
    """A Submitter running on a thread of this process."""

    address: str
    stop: threading.Event
    thread: threading.Thread

    def client(self, **options: object) -> Client:
        """A Client of this Submitter."""
        return Client([self.address], **options)  # type: ignore[arg-type]


def serve(settings: Settings, postgres: str, bindings: list[Binding],
          options: SubmitterOptions, clock: MinuteClock | None = None) -> Served:
    """Start a Submitter on a free port; returns once it listens."""
    stop, ready = threading.Event(), threading.Event()
    address: list[str] = []

    def on_ready(a: str) -> None:
        address.append(a)
        ready.set()

    run = settings.with_overrides(queue_shards=(postgres,))
    thread = threading.Thread(target=lambda: asyncio.run(serve_submitter(
        run, listen="127.0.0.1:0", stop=stop, options=options, ready_callback=on_ready,
        bindings=StaticBindings(bindings), stop_grace_s=5.0, capacity_clock=clock)),
        daemon=True)
    thread.start()
    assert ready.wait(60), "the Submitter did not start"
    return Served(address[0].replace("localhost", "127.0.0.1"), stop, thread)


@pytest.fixture
def tenant(queue_namespace: str) -> str:
    return queue_namespace


@pytest.fixture
def bindings(tenant: str) -> list[Binding]:
    fn = "tests.faults.funcs:run"
    return [
        Binding("q", Source("queue", "work"), fn, tenant=tenant),
        Binding("other", Source("queue", "work2"), fn, tenant=f"{tenant}-b"),
        Binding("av", Source("queue", "avwork"), fn, tenant=tenant,
                payload=Payload(format="avro", schema=AVRO_SCHEMA)),
        Binding("small", Source("queue", "smallwork"), fn, tenant=tenant,
                payload=Payload(max_bytes=64)),
    ]


def start(settings: Settings, postgres: str, bindings: list[Binding],
          clock: MinuteClock | None = None, **options: object) -> Iterator[Served]:
    served = serve(settings, postgres, bindings, SubmitterOptions(**options),  # type: ignore[arg-type]
                   clock)
    try:
        yield served
    finally:
        served.stop.set()
        served.thread.join(30)


@pytest.fixture
def clock() -> MinuteClock:
    return MinuteClock()


@pytest.fixture
def submitter(settings: Settings, postgres: str, bindings: list[Binding],
              clock: MinuteClock) -> Iterator[Served]:
    yield from start(settings, postgres, bindings, clock, max_backlog=None)


BAD = {  # ten kinds of bad workload for the queue binding "q" (JSON), and what each says
    "not json": (Workload(b"{nope"), "does not decode as the binding's format (json)"),
    "not utf-8": (Workload(b'"\xff\xfe"'), "not UTF-8"),
    "no payload": (Workload(None), "the payload is missing"),
    "too large": (Workload(b'"' + b"x" * (1024 * 1024) + b'"'), "over the 1,048,576-byte"),
    "priority": (Workload(b"{}", priority=1001), "priority 1001 is out of range"),
    "negative delay": (Workload(b"{}", delay_ms=-5), "delay -0.005s is out of range"),
    "long delay": (Workload(b"{}", delay_ms=400 * 86400_000), "delay 3.456e+07s"),
    "empty id": (Workload(b"{}", id=""), "id '' is not valid"),
    "id newline": (Workload(b"{}", id="a\nb"), "no control characters or newlines"),
    "key": (Workload(b"{}", key=b"k"), "a key applies to Kafka bindings only"),
    "header": (Workload(b"{}", headers=(("asynctier.attempt", b"1"),)),
               "names starting 'asynctier.' are the platform's"),
}


def test_each_bad_workload_is_refused_with_its_own_message_and_neighbours_accepted(
        submitter: Served, queue_store: QueueStore, tenant: str) -> None:
    """Each kind of bad workload sits between two good ones in one call: it is invalid
    with its own message; the good ones are accepted and stored."""
    loads: list[Workload] = []
    for n, (bad, _) in enumerate(BAD.values()):
        loads += [Workload(b'{"id": %d}' % (2 * n), id=f"g{2 * n}"), bad,
                  Workload(b'{"id": %d}' % (2 * n + 1), id=f"g{2 * n + 1}")]
    with submitter.client() as client:
        results = client.submit_many("q", loads)
        avro = client.submit_many("av", [b"\x02", b"\x02\x00"])
    reasons = []
    for n, (_kind, (_, says)) in enumerate(BAD.items()):
        before, bad, after = results[3 * n:3 * n + 3]
        assert (before.status, after.status) == ("accepted", "accepted")
        assert bad.status == "invalid" and says in (bad.reason or ""), (says, bad.reason)
        assert (bad.reason or "").startswith(f"workload {3 * n + 1}: ")
        reasons.append(bad.reason)
    assert len(set(reasons)) == len(BAD)
    assert [r.status for r in avro] == ["accepted", "invalid"]
    assert "avro: 1 byte(s) left over" in (avro[1].reason or "")
    [counts] = queue_store.counts(tenant, "work")
    assert counts.ready == 2 * len(BAD)


def test_a_bindings_own_payload_limit_replaces_the_default(
        submitter: Served, queue_store: QueueStore, tenant: str) -> None:
    """Binding "small" takes payloads of at most 64 bytes: 64 is accepted and stored, 65 is
    invalid with the binding's limit in the message; binding "q" still takes 65."""
    fits, over = b'"' + b"x" * 62 + b'"', b'"' + b"x" * 63 + b'"'
    with submitter.client() as client:
        small = client.submit_many("small", [Workload(fits, id="fits"),
                                             Workload(over, id="over")])
        wide = client.submit("q", over, id="wide")
    assert [r.status for r in small] == ["accepted", "invalid"]
    assert "over the 64-byte limit of binding small" in (small[1].reason or "")
    assert wide.status == "accepted"
    assert queue_store.get(tenant, "smallwork", "fits") is not None
    assert queue_store.get(tenant, "smallwork", "over") is None


def test_all_or_nothing_refuses_the_call_whole(submitter: Served, queue_store: QueueStore,
                                               tenant: str) -> None:
    with submitter.client() as client, pytest.raises(Exception, match="all or nothing"):
        client.submit_many("q", [b'{"id": 1}', b"{bad", b'{"id": 2}'], all_or_nothing=True)
    assert queue_store.counts(tenant, "work") == []


def set_capacity(settings: Settings, tenant: str, per_minute: int) -> None:
    async def run() -> None:
        client = Redis.from_url(settings.redis_url)
        await EnqueueCapacity(client, settings.names).set(tenant, per_minute)
        await client.aclose()

    asyncio.run(run())


def test_a_tenant_over_its_capacity_is_throttled_and_others_are_not(
        submitter: Served, settings: Settings, tenant: str) -> None:
    """Capacity 600 a minute: of a burst of 2,000 in calls of 100, 600 are accepted and
    1,400 throttled with a retry-after within the minute; another tenant's 500 go in."""
    set_capacity(settings, tenant, 600)  # the clock starts 1 s into a minute: no turn
    with submitter.client(max_batch=100, deadline_s=0.0) as client:
        burst = client.submit_many("q", [b'{"id": %d}' % i for i in range(2000)])
        others = client.submit_many("other", [b'{"id": %d}' % i for i in range(500)])
    statuses = [r.status for r in burst]
    assert statuses.count("accepted") == 600 and statuses.count("throttled") == 1400
    throttled = [r for r in burst if r.status == "throttled"]
    assert all(0 < (r.retry_after_ms or 0) <= 60_000 for r in throttled)
    assert "over its enqueue capacity" in (throttled[0].reason or "")
    assert [r.status for r in others] == ["accepted"] * 500
    counted = {o: REGISTRY.get_sample_value("asynctier_submitter_workloads_total",
                                            {"binding": "q", "tenant": tenant, "outcome": o})
               for o in ("accepted", "throttled")}
    assert counted == {"accepted": 600, "throttled": 1400}


@pytest.mark.parametrize("bad", [b"abc", b"-1", b"2.5", b""])
def test_a_bad_capacity_in_redis_is_refused_and_said_once(
        submitter: Served, settings: Settings, tenant: str, bad: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    """A capacity that is not a whole number >= 0 (written by hand, or by anything else)
    neither throttles every workload (-1) nor passes for a limit: the tenant's workloads
    are accepted without it, and the error names the tenant, the key and the fix, once."""
    client = redis.Redis.from_url(settings.redis_url)
    key = settings.names.tenant_key(tenant, "enqueue-capacity")
    client.set(key, bad)
    client.close()
    with caplog.at_level(logging.ERROR, logger="asynctier.submitter.capacity"), \
            submitter.client(max_batch=10, deadline_s=0.0) as sdk:
        first = sdk.submit_many("q", [b'{"id": %d}' % i for i in range(30)])
        second = sdk.submit_many("q", [b'{"id": %d}' % i for i in range(30)])
    assert [r.status for r in first + second] == ["accepted"] * 60
    said = [r.getMessage() for r in caplog.records if tenant in r.getMessage()]
    assert len(said) == 1, said
    assert key in said[0] and "asynctier quota set" in said[0]


def test_the_sdk_retries_throttled_workloads_until_they_are_in(
        submitter: Served, settings: Settings, tenant: str, queue_store: QueueStore,
        clock: MinuteClock) -> None:
    """Capacity 40 a minute, 60 workloads, 3 s before the window turns: 40 go in, the SDK
    sends the other 20 again after their retry-after (the rest of the window), and they
    are in once the next window opens."""
    set_capacity(settings, tenant, 40)
    clock.jump_to(57_000)
    started = time.monotonic()
    with submitter.client(max_batch=60, deadline_s=30.0) as client:
        results = client.submit_many("q", [b'{"id": %d}' % i for i in range(60)])
    assert [r.status for r in results] == ["accepted"] * 60
    took = time.monotonic() - started
    assert 2.0 < took < 20, took  # waited for the window, not for a whole minute
    [counts] = queue_store.counts(tenant, "work")
    assert counts.ready == 60


def test_a_flood_of_calls_gets_resource_exhausted_and_the_sdk_gets_through(
        settings: Settings, postgres: str, bindings: list[Binding],
        queue_store: QueueStore, tenant: str) -> None:
    """At most 200 workloads under way: 16 concurrent calls of 100 are partly refused
    RESOURCE_EXHAUSTED with a retry-after; the SDK, sending the same, gets all in."""
    gen = start(settings, postgres, bindings, max_pending=200, max_backlog=None)
    served = next(gen)
    try:
        request = encode_call(Call("q", [Workload(b'{"id": 1}')] * 100))
        channel = grpc.insecure_channel(served.address)
        stub = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        futures = [stub.future(request, timeout=30) for _ in range(16)]
        codes, retry_after = [], []
        for f in futures:
            try:
                f.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                retry_after += [v for k, v in exc.trailing_metadata() if k == RETRY_AFTER_KEY]
        channel.close()
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert retry_after and all(int(v) > 0 for v in retry_after)
        got: list[str] = []

        def caller(n: int) -> None:
            with served.client(max_batch=100) as client:
                got.extend(r.status for r in client.submit_many(
                    "q", [Workload(b'{"id": 2}', id=f"f{n}-{i}") for i in range(300)]))

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert got == ["accepted"] * 2400
    finally:
        next(gen, None)


def test_the_backlog_cap_throttles_until_the_topic_drains(
        settings: Settings, postgres: str, bindings: list[Binding],
        queue_store: QueueStore, tenant: str) -> None:
    """Cap 100 ready items, nothing draining: of 150, the call that reaches the cap is
    accepted, the next ones throttled; once the items are gone, accepted again."""
    gen = start(settings, postgres, bindings, max_backlog=100, backlog_recheck_s=0.1)
    served = next(gen)
    try:
        with served.client(max_batch=50, deadline_s=0.0) as client:
            first = client.submit_many("q", [b'{"id": %d}' % i for i in range(150)])
            assert [r.status for r in first[:100]] == ["accepted"] * 100
            wait_until(lambda: client.submit("q", b"{}").status == "throttled", 10,
                       "the Submitter sees the backlog")
            late = client.submit("q", b"{}")
            assert late.status == "throttled" and "over the cap of 100" in (late.reason or "")
            leased = queue_store.lease(tenant, "work", 10_000, 60, "test")
            queue_store.resolve(tenant, "work", "test", acks=[i.id for i in leased])
            wait_until(lambda: client.submit("q", b"{}").status == "accepted", 10,
                       "accepted again once the topic drained")
    finally:
        next(gen, None)


@pytest.mark.slow
def test_a_burst_of_2000_at_600_a_minute_gets_in_within_four_minutes(
        submitter: Served, settings: Settings, tenant: str, queue_store: QueueStore,
        clock: MinuteClock) -> None:
    """Capacity 600 a minute, a burst of 2,000 from one tenant (four callers): about 600
    are in within the first minute, the SDK's retries get all 2,000 in within 4 minutes,
    and another tenant's submissions meanwhile are never throttled."""
    set_capacity(settings, tenant, 600)
    started = time.monotonic()
    done: list[str] = []
    others: list[str] = []

    def caller(n: int) -> None:
        with submitter.client(max_batch=100, deadline_s=250.0) as client:
            done.extend(r.status for r in client.submit_many(
                "q", [b'{"id": %d}' % i for i in range(n * 500, n * 500 + 500)]))

    def other() -> None:
        with submitter.client(deadline_s=0.0) as client:
            while len(done) < 2000 and time.monotonic() - started < 250:
                others.extend(r.status for r in client.submit_many("other", [b"{}"] * 20))
                time.sleep(1.0)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=other))
    for t in threads:
        t.start()
    minute = clock() // 60_000

    def ready() -> int:
        counts = queue_store.counts(tenant, "work")
        return counts[0].ready if counts else 0

    wait_until(lambda: ready() >= 600, 30, "the first minute's 600 accepted")
    in_first_minute = ready()
    if clock() // 60_000 == minute:  # the next window has not opened yet
        assert in_first_minute == 600
    for t in threads:
        t.join(300)
    took = time.monotonic() - started
    assert done == ["accepted"] * 2000 and took < 240, took
    assert others and set(others) == {"accepted"}


def test_a_kafka_bindings_lag_over_the_cap_throttles_it(
        settings: Settings, postgres: str, tenant: str,
        unique_topic: Callable[..., str]) -> None:
    """A Kafka binding nobody consumes: once its consumer lag reaches the cap (100), its
    new workloads are throttled."""
    topic = unique_topic(partitions=2)
    kafka = Binding("kb", Source("kafka", topic), "tests.faults.funcs:run", tenant=tenant)
    gen = start(settings, postgres, [kafka], max_backlog=100, backlog_recheck_s=0.2)
    served = next(gen)
    try:
        with served.client(deadline_s=0.0) as client:
            first = client.submit_many("kb", [b'{"id": %d}' % i for i in range(120)])
            assert [r.status for r in first] == ["accepted"] * 120
            late = wait_until(lambda: (r := client.submit("kb", b"{}")).status == "throttled"
                              and r, 20, "the Submitter sees the lag")
            assert f"the backlog of {topic} is" in (late.reason or "")
    finally:
        next(gen, None)


def test_a_graph_through_the_sdk_waits_for_its_parents(
        submitter: Served, queue_store: QueueStore, tenant: str) -> None:
    """The upload flow through the Submitter: three encodes, then a publish ``after`` them in
    the same call, and a mail ``after`` the publish (another call, another topic's parent
    named by (topic, id)). The children are stored waiting with their parents; acking the
    parents releases them in turn."""
    encodes = [Workload(b'{"id": %d}' % n, id=f"enc-{n}") for n in range(3)]
    publish = Workload(b'{"id": 9}', id="pub", after=tuple((None, f"enc-{n}") for n in range(3)))
    with submitter.client() as client:
        results = client.submit_many("q", [*encodes, publish])
        [mail] = client.submit_many("other", [b'{"id": 10}'], ids=["mail"],
                                    after=[("work", "pub")])
        opf = client.submit("q", b'{"id": 11}', id="anyway", after=["enc-0"],
                            on_parent_failure="run")
    assert [r.status for r in results] == ["accepted"] * 4
    assert mail.status == "invalid" and "is not in namespace" in (mail.reason or ""), \
        "binding other is another tenant's: the parent is not in its namespace"
    assert opf.status == "accepted"
    info = queue_store.get(tenant, "work", "pub")
    assert info is not None and info.state == "waiting" and info.waiting_on == 3
    assert [p[:2] for p in info.parents] == [("work", f"enc-{n}") for n in range(3)]
    leased = sorted(i.id for i in queue_store.lease(tenant, "work", 10, 30, "w"))
    assert leased == ["enc-0", "enc-1", "enc-2"], "the children wait"
    assert queue_store.resolve(tenant, "work", "w", acks=leased).acked == 3
    assert sorted(i.id for i in queue_store.lease(tenant, "work", 10, 30, "w")) == [
        "anyway", "pub"]


def test_a_refused_parent_refuses_its_children_in_the_call_and_no_one_else(
        submitter: Served, queue_store: QueueStore, tenant: str) -> None:
    """A child of an unknown id is invalid, saying which parent and what to do; its own
    child in the same call is invalid too, naming it; the call's other workloads (a
    graph beside it) are stored. Bad parents are refused before anything is written."""
    loads = [Workload(b'{"id": 1}', id="root"),
             Workload(b'{"id": 2}', id="orphan", after=((None, "nobody"),)),
             Workload(b'{"id": 3}', id="grand", after=((None, "orphan"),)),
             Workload(b'{"id": 4}', id="leaf", after=((None, "root"),)),
             Workload(b'{"id": 5}', id="self", after=((None, "self"),)),
             Workload(b'{"id": 6}', id="bad", after=((None, "a\nb"),)),
             Workload(b'{"id": 7}', id="opf", on_parent_failure="later")]
    with submitter.client() as client:
        results = client.submit_many("q", loads[:-1])
        with pytest.raises(ValueError, match="on_parent_failure 'later' is not one of fail"):
            client.submit_many("q", loads[-1:])  # not on the wire: the enum has no such value
    status = {loads[r.position].id: (r.status, r.reason or "") for r in results}
    assert status["root"][0] == status["leaf"][0] == "accepted"
    assert status["orphan"][0] == "invalid"
    assert "workload 1: its parent work/nobody is not in namespace" in status["orphan"][1]
    assert status["grand"] == ("invalid",
                               "workload 2: its parent work/orphan was refused: see that workload")
    assert "names itself ('self') as its parent" in status["self"][1]
    assert "parent: id 'a\\nb' is not valid" in status["bad"][1]
    assert queue_store.get(tenant, "work", "orphan") is None
    assert queue_store.get(tenant, "work", "grand") is None
    leaf = queue_store.get(tenant, "work", "leaf")
    assert leaf is not None and leaf.state == "waiting"
