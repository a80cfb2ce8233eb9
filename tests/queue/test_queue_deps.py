"""Dependencies on a real PostgreSQL: a child waits for every parent, a dead parent's
children die ``parent_failed`` (or run), come back with its replay, and go with its
cancel; bad graphs are refused whole."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.platform.errors import QueueError
from asynctier.queue import Dead, NewItem, QueueStore
from asynctier.queue.shards import ShardedQueue
from tests.helpers import wait_until

ENC, PUB = "encode", "publish"


def lease_ids(store: QueueStore, ns: str, topic: str, n: int = 100, **kw: object) -> list[str]:
    return sorted(i.id for i in store.lease(ns, topic, n, 30, "w", **kw))  # type: ignore[arg-type]


def ack(store: QueueStore, ns: str, topic: str, *ids: str) -> None:
    assert store.resolve(ns, topic, "w", acks=ids).acked == len(ids)


def upload(store: QueueStore, ns: str, name: str, publish_opf: str = "fail") -> None:
    """The seeds' upload flow: three encodes, then a publish after all three."""
    encodes = [NewItem(ENC, b"{}", id=f"{name}-{r}") for r in ("360", "720", "1080")]
    publish = NewItem(PUB, b"{}", id=f"{name}-pub", on_parent_failure=publish_opf,
                      after=[(ENC, e.id) for e in encodes if e.id])
    assert all(r.created for r in store.enqueue(ns, [*encodes, publish]))


def state(store: QueueStore, ns: str, topic: str, item_id: str) -> str:
    info = store.get(ns, topic, item_id)
    return "gone" if info is None else info.state


def test_a_child_waits_for_every_parent_and_shows_them(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    upload(queue_store, ns, "v1")
    assert lease_ids(queue_store, ns, PUB) == []
    counts = {c.topic: c for c in queue_store.counts(ns)}
    assert (counts[PUB].waiting, counts[PUB].ready, counts[PUB].delayed) == (1, 0, 0)
    info = queue_store.get(ns, PUB, "v1-pub")
    assert info is not None and info.state == "waiting" and info.waiting_on == 3
    assert [p[2] for p in info.parents] == ["ready", "ready", "ready"]
    encode = queue_store.get(ns, ENC, "v1-360")
    assert encode is not None and encode.children == ((PUB, "v1-pub"),)

    assert lease_ids(queue_store, ns, ENC) == ["v1-1080", "v1-360", "v1-720"]
    ack(queue_store, ns, ENC, "v1-360", "v1-720")
    assert lease_ids(queue_store, ns, PUB) == []
    info = queue_store.get(ns, PUB, "v1-pub")
    assert info is not None and info.waiting_on == 1
    assert [p[2] for p in info.parents] == ["succeeded", "succeeded", "leased"]
    ack(queue_store, ns, ENC, "v1-1080")
    released = queue_store.get(ns, PUB, "v1-pub")
    assert released is not None and released.state == "ready"
    assert released.released_ms is not None and released.released_ms >= released.enqueued_ms
    assert lease_ids(queue_store, ns, PUB) == ["v1-pub"]


def test_a_dead_parent_makes_its_children_dead_and_a_replay_brings_them_back(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    upload(queue_store, ns, "v2")
    grandchild = NewItem("notify", b"{}", id="v2-mail", after=[(PUB, "v2-pub")])
    anyway = NewItem("cleanup", b"{}", id="v2-clean", after=[(ENC, "v2-720")],
                     on_parent_failure="run")
    queue_store.enqueue(ns, [grandchild, anyway])
    lease_ids(queue_store, ns, ENC)
    ack(queue_store, ns, ENC, "v2-360", "v2-1080")
    queue_store.resolve(ns, ENC, "w", deads=[Dead("v2-720", "function_error", "codec")])

    dead = {d.id: d for d in queue_store.dead_items(ns, PUB)}
    assert dead["v2-pub"].reason == "parent_failed"
    assert f"{ENC}/v2-720" in dead["v2-pub"].error
    assert queue_store.dead_items(ns, "notify")[0].reason == "parent_failed"
    assert state(queue_store, ns, "cleanup", "v2-clean") == "ready"  # on_parent_failure=run

    assert queue_store.replay(ns, ENC, ids=["v2-720"]) == 1
    assert state(queue_store, ns, PUB, "v2-pub") == "waiting"
    assert state(queue_store, ns, "notify", "v2-mail") == "waiting"
    assert lease_ids(queue_store, ns, ENC) == ["v2-720"]
    ack(queue_store, ns, ENC, "v2-720")
    assert lease_ids(queue_store, ns, PUB) == ["v2-pub"]
    ack(queue_store, ns, PUB, "v2-pub")
    assert lease_ids(queue_store, ns, "notify") == ["v2-mail"]
    ack(queue_store, ns, "notify", "v2-mail")
    assert lease_ids(queue_store, ns, "notify") == lease_ids(queue_store, ns, PUB) == []


def test_a_parent_whose_last_lease_ran_out_takes_its_children_with_it(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    upload(queue_store, ns, "v3")
    got = queue_store.lease(ns, ENC, 3, 0.05, "dies", max_attempts=1)
    assert len(got) == 3

    def buried() -> list[str]:  # once the leases ran out (the owner "died")
        assert queue_store.lease(ns, ENC, 3, 30, "w", max_attempts=1) == []
        return [d.reason for d in queue_store.dead_items(ns, PUB)]

    assert wait_until(buried, timeout=10) == ["parent_failed"]


def test_cancelling_a_parent_cancels_its_children(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    upload(queue_store, ns, "v4")
    queue_store.enqueue(ns, [NewItem("notify", b"{}", id="v4-mail", after=[(PUB, "v4-pub")])])
    assert queue_store.cancel(ns, ENC, "v4-360")
    assert state(queue_store, ns, PUB, "v4-pub") == "gone"
    assert state(queue_store, ns, "notify", "v4-mail") == "gone"
    assert state(queue_store, ns, ENC, "v4-720") == "ready"


@pytest.mark.parametrize(("after", "says"), [
    ([(ENC, "nope")], "its parent encode/nope is not in namespace"),
    ([("other", "x")], "its parent other/x is not in namespace"),
])
def test_an_unknown_parent_is_refused_and_nothing_is_enqueued(
        queue_store: QueueStore, queue_namespace: str, after: list[tuple[str, str]],
        says: str) -> None:
    ns = queue_namespace
    batch = [NewItem(ENC, b"{}", id="fine"), NewItem(PUB, b"{}", id="child", after=after)]
    with pytest.raises(QueueError, match=says):
        queue_store.enqueue(ns, batch)
    assert queue_store.counts(ns) == [] or all(
        c.ready == c.waiting == 0 for c in queue_store.counts(ns))


def test_a_parent_in_another_namespace_is_unknown_here(
        queue_store: QueueStore, queue_namespace: str) -> None:
    queue_store.enqueue(f"{queue_namespace}-b", [NewItem(ENC, b"{}", id="theirs")])
    with pytest.raises(QueueError, match=f"is not in namespace '{queue_namespace}'"):
        queue_store.enqueue(queue_namespace,
                            [NewItem(PUB, b"{}", id="mine", after=[(ENC, "theirs")])])


def test_cycles_cannot_be_expressed(queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    with pytest.raises(QueueError, match="comes later in the batch"):
        queue_store.enqueue(ns, [NewItem(ENC, b"", id="a", after=[(ENC, "b")]),
                                 NewItem(ENC, b"", id="b", after=[(ENC, "a")])])
    with pytest.raises(QueueError, match="names itself"):
        queue_store.enqueue(ns, [NewItem(ENC, b"", id="a", after=[(ENC, "a")])])
    queue_store.enqueue(ns, [NewItem(ENC, b"", id="a")])
    # "a" exists: enqueueing it again with a parent is a no-op that adds no edge
    queue_store.enqueue(ns, [NewItem(ENC, b"", id="b", after=[(ENC, "a")])])
    assert queue_store.enqueue(ns, [NewItem(ENC, b"", id="a", after=[(ENC, "b")])])[0].created \
        is False
    assert lease_ids(queue_store, ns, ENC) == ["a"]


def test_a_dead_parent_is_refused_saying_replay_it(
        queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    queue_store.enqueue(ns, [NewItem(ENC, b"", id="p")])
    lease_ids(queue_store, ns, ENC)
    queue_store.resolve(ns, ENC, "w", deads=[Dead("p", "function_error")])
    with pytest.raises(QueueError, match=r"is dead .* replay it first"):
        queue_store.enqueue(ns, [NewItem(PUB, b"", id="c", after=[(ENC, "p")])])


def test_parents_on_another_shard_are_refused(postgres: str, queue_namespace: str) -> None:
    with ShardedQueue([postgres, postgres.replace("127.0.0.1", "localhost")]) as q:
        topics = [f"t{n}" for n in range(20)]
        other = next(t for t in topics
                     if q.shard_of(queue_namespace, t) is not q.shard_of(queue_namespace, "t0"))
        with pytest.raises(QueueError, match="on another queue shard"):
            q.enqueue(queue_namespace, [NewItem("t0", b"", id="c", after=[(other, "p")])])


def test_fan_out_and_fan_in_release_in_time_with_no_child_early(
        queue_store: QueueStore, queue_namespace: str) -> None:
    """1 -> 1,000 -> 1, drained by four workers: no child leased before its parents were
    all acked, and each released within a second of its last parent's ack."""
    ns = queue_namespace
    kids = [NewItem("mid", b"", id=f"k{n}", after=[("root", "r")]) for n in range(1000)]
    queue_store.enqueue(ns, [NewItem("root", b"", id="r")])
    queue_store.enqueue(ns, kids)
    queue_store.enqueue(ns, [NewItem("sink", b"", id="s",
                                     after=[("mid", f"k{n}") for n in range(1000)])])
    acking: dict[str, float] = {}  # when the ack was sent: nothing may start before
    acked: dict[str, float] = {}  # when it returned: the child should start soon after
    started: dict[str, float] = {}
    lock = threading.Lock()

    def work(topic: str) -> bool:
        got = queue_store.lease(ns, topic, 50, 30, threading.current_thread().name)
        now = time.monotonic()
        with lock:
            started.update((i.id, now) for i in got)
        if got:
            with lock:
                acking.update((i.id, time.monotonic()) for i in got)
            queue_store.resolve(ns, topic, threading.current_thread().name,
                                acks=[i.id for i in got])
            done = time.monotonic()
            with lock:
                acked.update((i.id, done) for i in got)
        return bool(got)

    def worker() -> None:
        deadline = time.monotonic() + 60
        while "s" not in acked and time.monotonic() < deadline:
            if not any(work(t) for t in ("root", "mid", "sink")):
                time.sleep(0.01)

    threads = [threading.Thread(target=worker, name=f"w{n}") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    mids = [f"k{n}" for n in range(1000)]
    assert "s" in acked and len(started) == 1002
    assert min(started[k] for k in mids) >= acking["r"]
    assert started["s"] >= max(acking[k] for k in mids)
    assert min(started[k] for k in mids) - acked["r"] < 1.0
    assert started["s"] - max(acked[k] for k in mids) < 1.0


def test_the_cli_enqueues_children_and_shows_their_parents(
        postgres: str, queue_store: QueueStore, queue_namespace: str) -> None:
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres}
    ns = ["-n", queue_namespace, "--unbound"]
    run = CliRunner().invoke
    parents = run(main, ["enqueue", ENC, *ns, "--id-field", "id"], env=env,
                  input='{"id": "a"}\n{"id": "b"}\n')
    assert parents.exit_code == 0, parents.output
    child = run(main, ["enqueue", PUB, *ns, "--id-field", "id", "--after", "a,b",
                       "--after-topic", ENC], env=env, input='{"id": "c"}\n')
    assert child.exit_code == 0, child.output
    per_line = run(main, ["enqueue", "notify", *ns, "--id-field", "id", "--after-topic", PUB,
                          "--after-field", "after", "--on-parent-failure", "run"], env=env,
                   input='{"id": "m", "after": ["c"]}\n')
    assert per_line.exit_code == 0, per_line.output
    shown = run(main, ["queue", "show", PUB, "c", "-n", queue_namespace], env=env)
    assert "parent:            encode/a (ready)" in shown.output
    assert "waiting child:     notify/m" in shown.output
    stats = run(main, ["queue", "stats", "-n", queue_namespace, "--json"], env=env)
    waiting = {r["topic"]: r["waiting"] for r in json.loads(stats.output)}
    assert waiting == {ENC: 0, PUB: 1, "notify": 1}
    unknown = run(main, ["enqueue", PUB, *ns, "--after", "zzz", "--after-topic", ENC], env=env,
                  input='{"x": 1}\n')
    assert unknown.exit_code == 2
    assert "its parent encode/zzz is not in namespace" in unknown.output


def test_the_cli_replays_a_dead_parent_with_its_children(
        postgres: str, queue_store: QueueStore, queue_namespace: str) -> None:
    ns = queue_namespace
    upload(queue_store, ns, "v5")
    lease_ids(queue_store, ns, ENC)
    queue_store.resolve(ns, ENC, "w", deads=[Dead("v5-360", "function_error")])
    assert state(queue_store, ns, PUB, "v5-pub") == "dead"
    env = {"ASYNCTIER_CONFIG": "", "ASYNCTIER_QUEUE_SHARDS": postgres}
    done = CliRunner().invoke(main, ["queue", "replay", ENC, "-n", ns, "--id", "v5-360"],
                              env=env)
    assert done.exit_code == 0 and "replayed 1" in done.output, done.output
    assert state(queue_store, ns, PUB, "v5-pub") == "waiting"
