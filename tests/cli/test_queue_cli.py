"""``asynctier enqueue`` and ``asynctier queue ...`` against a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from asynctier.cli import main
from asynctier.platform.config import Settings
from asynctier.queue import Dead, QueueStore
from asynctier.queue.admin import LineOptions, replay_at_rate
from asynctier.queue.dsn import redact_dsn
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue

Run = Callable[..., Result]


@pytest.fixture
def run(postgres: str, queue_namespace: str) -> Run:
    """``asynctier ARGS --namespace <the test's>`` in-process, pointed at the session's
    PostgreSQL."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None, namespace: bool = True) -> Result:
        argv = [*args, "--namespace", queue_namespace] if namespace else list(args)
        if args[0] == "enqueue":  # no Kafka here: no bindings registry to check against
            argv.append("--unbound")
        return runner.invoke(main, argv, input=input,
                             env={"ASYNCTIER_QUEUE_SHARDS": postgres, "ASYNCTIER_CONFIG": ""})

    return invoke


def test_enqueue_refuses_bad_lines_and_enqueues_the_rest(
        run: Run, queue_store: QueueStore, queue_namespace: str) -> None:
    big = json.dumps({"id": "big", "blob": "x" * (1024 * 1024)})
    lines = "\n".join([json.dumps({"id": "a", "n": 1}), "not json", "",
                       json.dumps({"id": "b", "n": 2}), big, json.dumps({"n": 3}),
                       json.dumps({"id": "a", "n": 4}), json.dumps({"id": "bad\tid"})])
    result = run("enqueue", "jobs", "--priority", "5", "--id-field", "id", input=lines + "\n")
    assert result.exit_code == 1, result.output
    assert "line 2 is not JSON" in result.output
    assert "line 5: the payload is 1,048,601 bytes, over the" in result.output
    assert "line 6 has no string or integer field 'id'" in result.output
    assert "line 8: id 'bad\\tid' is not valid" in result.output
    assert "enqueued 2 item(s)" in result.output and "1 already there" in result.output
    info = queue_store.get(queue_namespace, "jobs", "a")
    assert info is not None
    assert (json.loads(info.payload), info.priority) == ({"id": "a", "n": 1}, 5)
    assert queue_store.get(queue_namespace, "jobs", "b") is not None


def test_enqueue_with_a_delay_and_generated_ids(run: Run, queue_store: QueueStore,
                                                queue_namespace: str) -> None:
    lines = "".join(json.dumps({"n": n}) + "\n" for n in range(2500))
    result = run("enqueue", "later", "--delay", "1h", input=lines)
    assert result.exit_code == 0, result.output
    [counts] = queue_store.counts(queue_namespace, "later")
    assert (counts.ready, counts.delayed) == (0, 2500)
    assert run("enqueue", "later", "--delay", "soon", input="{}\n").exit_code == 2
    assert run("enqueue", "later", "--priority", "1001", input="{}\n").exit_code == 2


def test_stats_show_cancel_dead_replay(run: Run, queue_store: QueueStore,
                                       queue_namespace: str) -> None:
    lines = "".join(json.dumps({"id": str(n)}) + "\n" for n in range(4))
    assert run("enqueue", "jobs", "--id-field", "id", input=lines).exit_code == 0
    got = queue_store.lease(queue_namespace, "jobs", 2, 30, "me")
    queue_store.resolve(queue_namespace, "jobs", "me",
                        deads=[Dead(got[0].id, "rejected", "it broke")])

    stats = run("queue", "stats", "--json")
    assert stats.exit_code == 0, stats.output
    [row] = json.loads(stats.output)
    assert (row["topic"], row["ready"], row["leased"], row["dead"]) == ("jobs", 2, 1, 1)
    assert row["shard"] == redact_dsn(queue_store.dsn)
    table = run("queue", "stats", "jobs")
    assert table.exit_code == 0 and "jobs" in table.output

    shown = run("queue", "show", "jobs", got[1].id, "--json")
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert (doc["state"], doc["lease_owner"], json.loads(doc["payload"])) == (
        "leased", "me", {"id": got[1].id})
    text = run("queue", "show", "jobs", got[0].id)
    assert "state:" in text.output and "dead" in text.output and "it broke" in text.output
    assert run("queue", "show", "jobs", "nope").exit_code == 1

    dead = run("queue", "dead", "jobs", "--json")
    assert [d["id"] for d in json.loads(dead.output)] == [got[0].id]
    assert "1 dead item(s)" in run("queue", "dead", "jobs").output
    replayed = run("queue", "replay", "jobs", "--limit", "5")
    assert replayed.exit_code == 0 and "replayed 1 dead item(s)" in replayed.output
    assert queue_store.dead_items(queue_namespace, "jobs") == []

    queue_store.enqueue(queue_namespace, [NewItem("jobs", b"{}", id="later", delay_s=3600)])
    now = run("queue", "run-now", "jobs", "later")
    assert now.exit_code == 0 and "is due now" in now.output
    assert queue_store.get(queue_namespace, "jobs", "later").state == "ready"  # type: ignore[union-attr]
    again = run("queue", "run-now", "jobs", "later")
    assert again.exit_code == 1 and "no delayed item 'later'" in again.output
    assert run("queue", "cancel", "jobs", "3").exit_code == 0
    assert queue_store.get(queue_namespace, "jobs", "3") is None
    gone = run("queue", "cancel", "jobs", "3")
    assert gone.exit_code == 1 and "no item '3'" in gone.output


def test_shards_lists_which_shard_holds_which_topic(run: Run, postgres: str,
                                                    queue_namespace: str) -> None:
    assert run("enqueue", "placed", input="{}\n").exit_code == 0
    result = run("queue", "shards", "--json", namespace=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["shards"] == [redact_dsn(postgres)]
    mine = [t for t in doc["topics"] if t["namespace"] == queue_namespace]
    assert mine == [{"namespace": queue_namespace, "topic": "placed",
                     "shard": redact_dsn(postgres), "held_on": [redact_dsn(postgres)]}]
    assert f"{queue_namespace}/placed -> " in run("queue", "shards", namespace=False).output


def test_a_shard_that_is_down_is_one_clear_error(queue_namespace: str) -> None:
    from asynctier.dev import free_port

    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    result = CliRunner().invoke(main, ["queue", "stats", "--namespace", queue_namespace],
                                env={"ASYNCTIER_QUEUE_SHARDS": dsn, "ASYNCTIER_CONFIG": ""})
    assert result.exit_code == 2
    assert f"queue shard {redact_dsn(dsn)} is unavailable" in result.output


def test_replay_at_a_rate_sleeps_between_batches(queue_store: QueueStore, postgres: str,
                                                 queue_namespace: str) -> None:
    from asynctier.queue.admin import enqueue_lines

    with ShardedQueue([postgres]) as queue:
        enqueue_lines(queue, queue_namespace, [f'{{"n": {n}}}' for n in range(30)],
                      LineOptions("slow"))
        got = queue.lease(queue_namespace, "slow", 30, 30, "me")
        queue.resolve(queue_namespace, "slow", "me", deads=[Dead(g.id, "x") for g in got])
        sleeps: list[float] = []
        assert replay_at_rate(queue, queue_namespace, "slow", limit=25, rate_per_s=10,
                              sleep=sleeps.append) == 25
        assert len(sleeps) == 3 and all(0.5 < s <= 1.0 for s in sleeps[:2])
        assert len(queue.dead_items(queue_namespace, "slow")) == 5


def test_enqueue_to_a_topic_no_binding_reads_is_refused_saying_what_to_do(
        settings: Settings, postgres: str, queue_namespace: str,
        queue_store: QueueStore) -> None:
    """Its items would wait forever: refused, nothing enqueued, until a binding reads it."""
    runner = CliRunner()
    env = {"ASYNCTIER_QUEUE_SHARDS": postgres, "ASYNCTIER_CONFIG": "",
           "ASYNCTIER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "ASYNCTIER_PREFIX": settings.prefix}
    args = ["enqueue", "orphans", "--namespace", queue_namespace]
    refused = runner.invoke(main, args, input='{"n": 1}\n', env=env)
    assert refused.exit_code == 2
    assert "no binding reads queue topic 'orphans'" in refused.output
    assert "asynctier bind NAME --queue orphans" in refused.output
    assert queue_store.counts(queue_namespace, "orphans") == []
    bound = runner.invoke(main, ["bind", "o", "--queue", "orphans", "--tenant", queue_namespace,
                                 "--function", "tests.funcs.ledger:record"], env=env)
    assert bound.exit_code == 0, bound.output
    accepted = runner.invoke(main, args, input='{"n": 1}\n', env=env)
    assert accepted.exit_code == 0, accepted.output
    [counts] = queue_store.counts(queue_namespace, "orphans")
    assert counts.ready == 1
