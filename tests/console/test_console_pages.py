"""The console's pages and actions over the real Kafka, Redis and PostgreSQL, through its
HTTP interface (Starlette's test client): login, escaping, CSRF, read-only, replaying a dead
letter that then runs once, the queue's pages and cancel, and services going away."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from asynctier.platform.config import Settings
from asynctier.platform.paused import read_paused
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.tracing import TracingSettings, trace_id_of
from asynctier.queue import QueueStore
from asynctier.queue.items import NewItem
from asynctier.queue.shards import ShardedQueue
from asynctier.schedules.spec import Schedule
from asynctier.schedules.store import ScheduleStore
from tests.console.support import TOKEN, console, csrf_of, log_in, sample
from tests.delay_streams.test_dlq import dead_letters, ledger_file, scheduler  # noqa: F401
from tests.funcs import delay as delayfuncs
from tests.funcs import ledger
from tests.funcs.delay import LocalScheduler
from tests.helpers import wait_until

HOSTILE = "<script>alert(1)</script>"


def _job_done(client: TestClient) -> bool:
    return 'data-state="done"' in client.get("/live/jobs").text


def test_without_login_every_page_and_action_is_refused(settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1}])
    with console(settings) as client:
        for path in ("/", "/bindings/orders", "/dlq/orders", "/dlq/orders/0", "/jobs",
                     "/queue", "/queue/item?topic=t&id=1"):
            response = client.get(path, follow_redirects=False)
            assert response.status_code == 303 and response.headers["location"] == "/login"
        assert client.get("/live/overview").status_code == 401
        for path in ("/dlq/orders/replay", "/queue/default/t/cancel", "/jobs/1/stop",
                     "/tenants/weight", "/tenants/quota", "/bindings/orders/pause"):
            assert client.post(path, data={"offset": "0"}).status_code == 401
        wrong = client.get("/", headers={"authorization": "Bearer not-the-token-at-all"},
                           follow_redirects=False)
        assert wrong.status_code == 303
        refused = client.post("/login", data={"token": "wrong"})
        assert refused.status_code == 401 and "not the console&#39;s token" in refused.text
        right = client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200


def test_overview_shows_a_binding_and_a_hostile_payload_is_shown_as_text(
        settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1, "note": HOSTILE}, HOSTILE.encode()])
    with console(settings) as client:
        log_in(client)
        snapshot = sample(client)
        view = snapshot.view("orders")
        assert view is not None and view.dead == 2 and view.dead_waiting == 2
        page = client.get("/").text
        assert 'data-binding="orders"' in page and f"topic {settings.prefix}.src" in page
        listing = client.get("/dlq/orders").text
        assert 'data-offset="0"' in listing and 'data-offset="1"' in listing
        for offset in (0, 1):
            shown = client.get(f"/dlq/orders/{offset}").text
            assert HOSTILE not in shown
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
        assert "boom 0" in client.get("/dlq/orders?error=BOOM+0").text
        assert 'data-offset="1"' not in client.get("/dlq/orders?error=boom+0").text


def test_bad_parameters_get_a_clear_400(settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1}])
    with console(settings) as client:
        log_in(client)
        for path, says in (("/bindings/Bad%20Name", "not a binding name"),
                           ("/dlq/orders/-1", "not a whole number"),
                           ("/dlq/orders/99999999999999999999", "not a whole number"),
                           ("/dlq/orders?start=abc", "'start'"),
                           ("/dlq/orders?since=yesterday", "not a time"),
                           ("/dlq/orders?error=" + "x" * 300, "longer than 200"),
                           ("/queue?namespace=%3Cb%3E", "not a namespace")):
            response = client.get(path)
            assert response.status_code == 400, (path, response.text)
            assert says in response.text.replace("&#39;", "'"), (path, response.text)
        assert client.get("/dlq/orders/5").status_code == 404
        assert client.get("/bindings/nobody").status_code == 404


def test_a_dead_letter_replayed_from_the_console_runs_once(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path) -> None:  # noqa: F811
    dead_letters(settings, "orders", [{"id": i, "always_fail": True} for i in range(3)])
    scheduler.functions["orders"] = delayfuncs.fixed
    settings = dataclasses.replace(settings, schedulers=(scheduler.address,))
    with console(settings) as client:
        csrf = log_in(client)
        forged = client.post("/dlq/orders/replay", data={"offset": "1"})
        assert forged.status_code == 403 and "CSRF" in forged.text
        assert client.post("/dlq/orders/replay",
                           data={"offset": "1", "csrf": "x" * 43}).status_code == 403
        done = client.post("/dlq/orders/replay", data={"offset": "1", "csrf": csrf})
        assert done.status_code == 200 and "replay 1 chosen dead letter(s) of orders" in done.text
        wait_until(lambda: _job_done(client), 30, "the replay job to finish")
        calls = ledger.read(ledger_file)
        assert [(c.id, c.attempt) for c in calls] == [(1, 1)]
        bulk = client.post("/dlq/orders/replay", data={"csrf": csrf})
        assert bulk.status_code == 400 and "confirmation" in bulk.text
        # the chosen replay left the replay position alone: a bulk one takes all three
        client.post("/dlq/orders/replay", data={"csrf": csrf, "confirm": "yes"})
        wait_until(lambda: len(ledger.read(ledger_file)) == 4, 30, "the bulk replay")
        assert sorted(c.id for c in ledger.read(ledger_file)) == [0, 1, 1, 2]
        wait_until(lambda: _job_done(client), 30, "the bulk replay job to finish")
        everything = client.post("/dlq/orders/purge", data={"csrf": csrf, "scope": "all"})
        assert everything.status_code == 400 and "confirmation" in everything.text
        purged = client.post("/dlq/orders/purge", data={"csrf": csrf, "scope": "replayed"})
        assert purged.status_code == 200 and "deleted 3 dead letter(s) of orders" in purged.text
        assert 'data-offset="' not in client.get("/dlq/orders").text


def test_read_only_offers_no_action_and_refuses_a_forged_one(settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1}])
    with console(settings, read_only=True) as client:
        csrf = log_in(client)
        sample(client)
        pages = [client.get(p).text for p in ("/", "/dlq/orders", "/dlq/orders/0", "/jobs")]
        assert all('method="post" action="/dlq' not in p for p in pages)
        assert 'id="read-only"' in pages[0]
        for path, data in (("/dlq/orders/replay", {"offset": "0"}),
                           ("/dlq/orders/replay", {"confirm": "yes"}),
                           ("/queue/default/t/cancel", {"id": "1"}),
                           ("/queue/default/t/replay", {"confirm": "yes"}),
                           ("/jobs/1/stop", {}),
                           ("/tenants/weight", {"tenant": "acme", "weight": "2"}),
                           ("/tenants/quota", {"tenant": "acme", "per_minute": "5"}),
                           ("/bindings/orders/pause", {}),
                           ("/queue/default/t/run-now", {"id": "1"}),
                           ("/dlq/orders/purge", {"scope": "all", "confirm": "yes"}),
                           ("/tenants/limits", {"binding": "orders", "rate": "5"})):
            response = client.post(path, data={**data, "csrf": csrf})
            assert response.status_code == 403 and "read-only" in response.text
        by_script = client.post("/dlq/orders/replay", data={"offset": "0"},
                                headers={"authorization": f"Bearer {TOKEN}"})
        assert by_script.status_code == 403
        assert client.app.state.console.jobs.all() == []  # type: ignore[attr-defined]


def test_queue_pages_find_and_cancel_an_item(settings: Settings, postgres: str,
                                             queue_store: QueueStore,
                                             queue_namespace: str) -> None:
    settings = dataclasses.replace(settings, queue_shards=(postgres,), tracing=TracingSettings(
        trace_url="http://jaeger:16686/trace/{trace_id}"))
    queue_store.enqueue(queue_namespace, [NewItem("jobs", HOSTILE.encode(), id="a1"),
                                          NewItem("jobs", b"{}", id="a2")])
    with console(settings) as client:
        csrf = log_in(client)
        counts = client.get(f"/queue?namespace={queue_namespace}").text
        assert 'data-topic="jobs"' in counts
        item = client.get(f"/queue/item?namespace={queue_namespace}&topic=jobs&id=a1").text
        assert HOSTILE not in item and "&lt;script&gt;" in item
        trace = trace_id_of([], f"queue/{queue_namespace}/jobs/a1")  # the trace its runs are in
        assert f'href="http://jaeger:16686/trace/{trace}"' in item
        page = client.get(f"/queue/{queue_namespace}/jobs/items?state=ready").text
        assert re.findall(r'data-item="([^"]+)"', page) == ["a1", "a2"]
        assert HOSTILE not in page and "&lt;script&gt;" in page
        assert client.get(f"/queue/{queue_namespace}/jobs/items?state=dead").status_code == 400
        assert client.get(f"/queue/{queue_namespace}/jobs/items?start=-1").status_code == 400
        queue_store.enqueue(queue_namespace, [NewItem("jobs", b"{}", id="a&3", delay_s=3600)])
        later = client.get(f"/queue/item?namespace={queue_namespace}&topic=jobs&id=a%263")
        assert 'id="run-now"' in later.text
        assert 'id="run-now"' not in item  # a1 is ready: nothing to bring forward
        ran = client.post(f"/queue/{queue_namespace}/jobs/run-now",
                          data={"id": "a&3", "csrf": csrf})
        assert ran.status_code == 200 and 'id="run-now"' not in ran.text
        assert queue_store.get(queue_namespace, "jobs", "a&3").state == "ready"  # type: ignore[union-attr]
        assert client.post(f"/queue/{queue_namespace}/jobs/run-now",
                           data={"id": "a&3", "csrf": csrf}).status_code == 409
        gone = client.post(f"/queue/{queue_namespace}/jobs/cancel",
                           data={"id": "a1", "csrf": csrf})
        assert gone.status_code == 200 and "cancelled item" in gone.text
        assert queue_store.get(queue_namespace, "jobs", "a1") is None
        assert queue_store.get(queue_namespace, "jobs", "a2") is not None
        again = client.post(f"/queue/{queue_namespace}/jobs/cancel",
                            data={"id": "a1", "csrf": csrf})
        assert again.status_code == 404


def _waiting(client: TestClient, ns: str, topic: str) -> int:
    """The waiting count of ``topic`` on the queue page."""
    page = client.get(f"/queue?namespace={ns}").text
    found = re.search(rf'data-topic="{topic}">[^\n]*data-waiting="(\d+)"', page)
    assert found, page
    return int(found.group(1))


def test_queue_pages_show_schedules_and_items_waiting_for_parents(
        settings: Settings, postgres: str, queue_store: QueueStore,
        queue_namespace: str) -> None:
    ns = queue_namespace
    settings = dataclasses.replace(settings, queue_shards=(postgres,))
    queue_store.enqueue(ns, [NewItem("encode", b"{}", id="p1"),
                             NewItem("publish", b"{}", id="c1", after=[("encode", "p1")])])
    with ShardedQueue([postgres], pool_size=2) as q:
        schedules = ScheduleStore(q)
        schedules.add(Schedule(namespace=ns, name="nightly", topic="reports", every_s=3600))
        try:
            with console(settings, sample_every_s=0.5) as client:  # counts kept 0.5 s
                log_in(client)
                assert _waiting(client, ns, "publish") == 1
                page = client.get(f"/queue?namespace={ns}").text
                assert 'data-schedule="nightly" data-state="active"' in page
                assert "every 3600s" in page
                child = client.get(f"/queue/item?namespace={ns}&topic=publish&id=c1").text
                assert "Waiting for 1 parent(s)" in child
                assert re.search(r'data-parent="p1">.*?</a></td><td>ready</td>', child)
                parent = client.get(f"/queue/item?namespace={ns}&topic=encode&id=p1").text
                assert 'data-child="c1"' in parent
                leased = queue_store.lease(ns, "encode", 1, 30, "w")
                assert [i.id for i in leased] == ["p1"]
                queue_store.resolve(ns, "encode", "w", acks=["p1"])
                child = client.get(f"/queue/item?namespace={ns}&topic=publish&id=c1").text
                assert "Waiting for" not in child and 'id="released"' in child
                wait_until(lambda: _waiting(client, ns, "publish") == 0, 10,
                           "the released child no longer counted as waiting")
        finally:
            schedules.remove(ns, "nightly")


def test_pages_say_what_is_down_and_recover(settings: Settings, tmp_path: Path) -> None:
    from asynctier import dev as devstack

    node = devstack.start_test_redis(tmp_path)
    dead_letters(settings, "orders", [{"id": 1}])
    settings = dataclasses.replace(settings, redis_url=node.url)
    try:
        with console(settings) as client:
            log_in(client)
            assert sample(client).down == {}
            node.stop()
            down = sample(client)
            assert "redis" in down.down and down.view("orders") is not None
            page = client.get("/")
            assert page.status_code == 200 and 'data-down="redis"' in page.text
            assert 'data-binding="orders"' in page.text
            node.start()
            wait_until(lambda: sample(client).down == {}, 20, "Redis to answer again")
            assert 'data-down' not in client.get("/").text
            assert csrf_of(client.get("/").text)
    finally:
        node.stop()


def test_the_binding_page_shows_lag_falling_as_the_group_commits(
        settings: Settings, unique_topic: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from tests.platform_harness import produce_json

    topic = unique_topic(partitions=2, name=f"{settings.prefix}.src")
    dead_letters(settings, "orders", [{"id": 0}])
    produce_json(settings, topic, [{"id": i} for i in range(10)])
    with console(settings) as client:
        log_in(client)
        before = sample(client).view("orders")
        assert before is not None and before.lag == 10 and len(before.partitions) == 2
        group = Consumer(settings.kafka_config(**{"group.id": settings.names.group("orders"),
                                                  "enable.auto.commit": False}))
        ends = [group.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in (0, 1)]
        group.commit(offsets=[TopicPartition(topic, p, ends[p]) for p in (0, 1)],
                     asynchronous=False)
        group.close()
        after = sample(client).view("orders")
        assert after is not None and after.lag == 0
        assert after.throughput is not None and after.throughput > 0
        page = client.get("/bindings/orders").text
        assert 'id="partitions"' in page and '<b id="lag">0</b>' in page
        points = re.search(r'id="lag-chart".*?points="([^"]*)"', page, re.S)
        assert points and len(points.group(1).split()) == 2  # two samples: 10, then 0
        assert 'id="lag"' in client.get("/live/bindings/orders").text


def test_a_bulk_replay_by_filter_keeps_to_its_rate_and_stops_on_a_failing_canary(
        settings: Settings, scheduler: LocalScheduler, ledger_file: Path,  # noqa: F811
        caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest) -> None:
    from tests.funcs import basic

    count = 10_000 if request.config.getoption("--long") else 300
    rate = 2_000.0 if count > 1000 else 200.0
    dead_letters(settings, "orders", [{"id": i} for i in range(count)])
    scheduler.functions["orders"] = ledger.record
    settings = dataclasses.replace(settings, schedulers=(scheduler.address,))
    with console(settings) as client:
        csrf = log_in(client)
        caplog.set_level(logging.INFO, "asynctier.console.audit")
        started = time.monotonic()
        client.post("/dlq/orders/replay", data={"csrf": csrf, "confirm": "yes",
                                                "error": "BOOM", "rate": str(rate)})
        wait_until(lambda: 'data-state="done"' in client.get("/live/jobs").text,
                   count / rate * 3 + 30, "the bulk replay to finish")
        elapsed = time.monotonic() - started
        assert sorted(c.id for c in ledger.read(ledger_file)) == list(range(count))
        assert elapsed >= count / rate * 0.9, elapsed  # it kept to its rate
        assert "action=dlq replay target=orders (every dead letter matching the filter)" \
            in caplog.text and "user=operator" in caplog.text
        scheduler.functions["orders"] = basic.boom  # the fix did not hold
        client.post("/dlq/orders/replay", data={"csrf": csrf, "confirm": "yes",
                                                "canary": "5", "error": "boom"})
        wait_until(lambda: 'data-state="stopped"' in client.get("/live/jobs").text, 30,
                   "the canary to stop the second replay")
        stopped = client.app.state.console.jobs.all()[0]  # type: ignore[attr-defined]
        assert stopped.report.replayed == 5 and "canary: 5 of 5" in stopped.report.stopped
        assert "canary: 5 of 5" in client.get("/jobs").text


def test_tenants_page_shows_weights_and_edits_one(settings: Settings) -> None:
    with console(settings) as client:
        csrf = log_in(client)
        assert client.get("/tenants").status_code == 200
        set_ = client.post("/tenants/weight", data={"csrf": csrf, "tenant": "acme",
                                                    "weight": "3"})
        assert set_.status_code == 200 and 'data-tenant="acme"' in set_.text
        assert re.search(r'data-tenant="acme">.*?class="n weight">3<', set_.text, re.S)
        for bad in ({"tenant": "acme", "weight": "nan"}, {"tenant": "acme", "weight": "1e9"},
                    {"tenant": "<b>", "weight": "2"}):
            assert client.post("/tenants/weight", data={"csrf": csrf, **bad}).status_code == 400


def test_the_binding_page_pauses_and_resumes_it(settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1}])
    with console(settings) as client:
        csrf = log_in(client)
        sample(client)
        assert 'id="pause"' in client.get("/bindings/orders").text
        paused = client.post("/bindings/orders/pause", data={"csrf": csrf})
        assert paused.status_code == 200 and 'id="paused"' in paused.text
        assert 'id="resume"' in paused.text and "by console:operator" in paused.text
        assert set(read_paused(settings)) == {"orders"}
        assert sample(client).view("orders").state == "paused"  # type: ignore[union-attr]
        resumed = client.post("/bindings/orders/resume", data={"csrf": csrf})
        assert 'id="paused"' not in resumed.text and 'id="pause"' in resumed.text
        assert read_paused(settings) == {}
        assert client.post("/bindings/nosuch/pause", data={"csrf": csrf}).status_code == 404
        assert read_paused(settings) == {}


def test_tenants_page_sets_a_bindings_rate_and_cap_as_bind_stores_them(
        settings: Settings) -> None:
    dead_letters(settings, "orders", [{"id": 1}])
    registry = BindingRegistry(settings)
    with console(settings) as client:
        csrf = log_in(client)
        sample(client)
        assert 'data-limits="orders"' in client.get("/tenants").text
        set_ = client.post("/tenants/limits", data={"csrf": csrf, "binding": "orders",
                                                    "rate": "50", "concurrency": "4"})
        assert set_.status_code == 200
        stored = registry.load()["orders"]
        assert (stored.limits.rate_per_s, stored.limits.max_concurrency) == (50.0, 4)
        for bad in ({"rate": "-1"}, {"rate": "nan"}, {"concurrency": "0"},
                    {"concurrency": "1.5"}):
            form = {"csrf": csrf, "binding": "orders", **bad}
            assert client.post("/tenants/limits", data=form).status_code == 400
        assert client.post("/tenants/limits", data={"csrf": csrf, "binding": "nosuch"}
                           ).status_code == 404
        client.post("/tenants/limits", data={"csrf": csrf, "binding": "orders", "rate": "",
                                             "concurrency": ""})
        stored = registry.load()["orders"]
        assert (stored.limits.rate_per_s, stored.limits.max_concurrency) == (None, None)


def _quota_cell(page: str, tenant: str) -> str:
    found = re.search(rf'data-tenant="{tenant}">.*?</tr>', page, re.S)
    assert found, page
    return re.findall(r'<td class="n">([^<]*)</td>', found.group(0))[-2]  # per minute


def test_tenants_page_sets_a_quota_and_lifts_it(settings: Settings) -> None:
    with console(settings) as client:
        csrf = log_in(client)
        set_ = client.post("/tenants/quota", data={"csrf": csrf, "tenant": "quoted",
                                                   "per_minute": "120", "per_day": ""})
        assert set_.status_code == 200 and _quota_cell(set_.text, "quoted") == "120 (0)"
        for bad in ({"per_minute": "0"}, {"per_minute": "-5"}, {"per_minute": "abc"},
                    {"per_day": "1e3"}, {"tenant": "<b>", "per_minute": "5"}):
            form = {"csrf": csrf, "tenant": "quoted", **bad}
            assert client.post("/tenants/quota", data=form).status_code == 400
        assert _quota_cell(client.get("/tenants").text, "quoted") == "120 (0)"
        lifted = client.post("/tenants/quota", data={"csrf": csrf, "tenant": "quoted",
                                                     "per_minute": "", "per_day": ""})
        assert 'data-tenant="quoted"' not in lifted.text or \
            _quota_cell(lifted.text, "quoted") == "-"


def test_with_the_broker_away_the_overview_keeps_the_last_numbers_and_says_so(
        settings: Settings) -> None:
    from tests.platform_harness import free_port

    dead_letters(settings, "orders", [{"id": 1}])
    with console(settings) as client:
        log_in(client)
        sampler = client.app.state.console.sampler  # type: ignore[attr-defined]
        assert sample(client).down == {}
        # the sampler's next reads go to an address where no broker answers
        sampler.settings = dataclasses.replace(
            settings, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
        away = sample(client, timeout_s=2.0)
        assert "kafka" in away.down and away.view("orders") is not None
        page = client.get("/")
        assert page.status_code == 200 and 'data-down="kafka"' in page.text
        assert "numbers below were read" in page.text and 'data-binding="orders"' in page.text
        sampler.settings = settings
        assert sample(client).down == {}
        assert "data-down" not in client.get("/").text
