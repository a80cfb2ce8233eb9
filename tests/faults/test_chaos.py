"""Chaos: every component SIGKILLed in turn while a Kafka binding and a queue binding drain.

Two schedulers, the tailers and the delay tailers run as real processes, supervised (a
killed one is started again after a short pause, as systemd's ``RestartSec`` would);
Redis, the broker and PostgreSQL are this test's own (``start_test_*`` in its folder),
SIGKILLed and started again on the same port with the same data. Records (10% fail once)
are produced to the Kafka topic and items enqueued in the queue at steady rates the whole
time, so every kill lands on work under way.

The proof is the file ledger (``tests.faults.funcs:run``), not Redis: every record and
item succeeded, the binding's group is at the end of its topic, nothing waits in a delay
topic, the queue is empty and nothing is a dead letter. Duplicates are counted per kill
(a success beyond an id's first is put on the last kill before it).

The short form (about 90 s) kills, in this order, 10 s apart: scheduler A, the tailers,
the delay tailers, scheduler B, Redis, the broker, PostgreSQL. With ``--long`` it runs 10
minutes with random victims, pauses and intervals from a seed, printed at the start;
``ASYNCTIER_CHAOS_SEED=N`` replays a run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from asynctier import dev as devstack
from asynctier.dev.process import port_answers
from asynctier.dev.replica import crash
from asynctier.platform.config import Settings
from asynctier.platform.errors import QueueUnavailable, ServiceError
from asynctier.platform.kafka import admin, ensure_topics
from asynctier.queue.items import NewItem
from asynctier.queue.store import QueueStore
from tests.conftest import service_unavailable
from tests.faults import checker
from tests.faults.checker import Call, Report
from tests.faults.harness import FUNCTION, FaultPlatform
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end

log = logging.getLogger(__name__)

LADDER = (1.0, 2.0)
RETRIES = ("--retry-ladder", "1s,2s", "--max-attempts", "3")
BATCH = 200  # the tailers' --batch-size, Kafka and queue alike
IN_FLIGHT = 4  # the tailers' default max_in_flight
DELAY_BATCH = 500  # DelayOptions.batch_size
KAFKA_PER_S = 100  # records produced a second, the whole scenario long
QUEUE_PER_S = 50  # items enqueued a second
QUEUE_BASE = 1_000_000  # queue item ids start here; Kafka record ids at 0
SLEEP_S = 0.002  # each call's work: calls are under way when a kill lands
PROCESSES = ("scheduler-a", "scheduler-b", "tailers", "delay")
SERVICES = ("redis", "kafka", "postgres")
SHORT_ORDER = ("scheduler-a", "tailers", "delay", "scheduler-b", "redis", "kafka", "postgres")
SHORT_EVERY_S = 10.0  # from one kill to the next (or from the victim's return, if later)
SHORT_PAUSE_S = 1.0  # a supervisor's pause before it starts a victim again
LONG_S = 600.0
WARMUP_S = 5.0  # both bindings run before the first kill
TAIL_S = 5.0  # records keep coming after the last victim is back
RECOVER_S = 120.0  # after a victim is back, both bindings make progress within this
SETTLE_S = 240.0  # after the last record is produced, everything is resolved within this
# Duplicates allowed per kill: what a victim may have run that was not yet written down,
# as in the other scenarios (test_crashes: one batch per crash; test_services: the
# tailer's window for the broker, in-flight batches for Redis), here for both bindings.
ALLOWED = {"scheduler": 2 * BATCH, "tailers": 2 * BATCH, "delay": DELAY_BATCH,
           "redis": IN_FLIGHT * BATCH, "kafka": 2 * IN_FLIGHT * BATCH,
           "postgres": IN_FLIGHT * BATCH}


@dataclass
class Services:
    """This test's own Redis, Kafka and PostgreSQL."""

    redis: devstack.RedisNode
    kafka: devstack.KafkaNode
    postgres: devstack.PostgresNode

    def kill(self, name: str) -> None:
        """SIGKILL a service (PostgreSQL: its whole process group, backends too)."""
        if name == "postgres":
            assert crash(self.postgres), "PostgreSQL was not running"
        else:
            assert getattr(self, name).kill(), f"{name} was not running"

    def restart(self, name: str) -> None:
        """Start a killed service again, same port and data; returns once it answers."""
        node: devstack.RedisNode | devstack.KafkaNode | devstack.PostgresNode = getattr(
            self, name)
        node.restart()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    """A Redis, a Kafka and a PostgreSQL of this test only, stopped at the end."""
    root = tmp_path / "own"
    started: list[Any] = []
    try:
        started.append(devstack.start_test_redis(root))
        started.append(devstack.start_test_kafka(root))
        started.append(devstack.start_test_postgres(root))
    except ServiceError as exc:
        for node in started:
            node.stop()
        service_unavailable("a service of the test's own", exc)
    redis_node, kafka_node, pg_node = started
    try:
        yield Services(redis_node, kafka_node, pg_node)
    finally:
        for node in reversed(started):
            node.stop()
        if not pg_node.data_dir.is_relative_to(root):  # see start_test_postgres
            shutil.rmtree(pg_node.data_dir.parent, ignore_errors=True)


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One kill: the victim, the pause before it comes back, the time to the next kill."""

    victim: str
    pause_s: float
    every_s: float


def short_plan() -> list[Step]:
    """Every component once, in a fixed order, at fixed intervals."""
    return [Step(v, SHORT_PAUSE_S, SHORT_EVERY_S) for v in SHORT_ORDER]


def long_plan(seed: int, total_s: float = LONG_S) -> list[Step]:
    """Random victims, pauses (0.2-5 s) and intervals (3-25 s) over ``total_s``."""
    rng = random.Random(seed)
    steps: list[Step] = []
    while sum(s.every_s for s in steps) < total_s:
        steps.append(Step(rng.choice(SHORT_ORDER), round(rng.uniform(0.2, 5.0), 2),
                          round(rng.uniform(3.0, 25.0), 2)))
    return steps


def chaos_seed() -> int:
    """``$ASYNCTIER_CHAOS_SEED``, else a fresh one."""
    given = os.environ.get("ASYNCTIER_CHAOS_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**31)


@dataclass
class Kill:
    """A kill done: when (epoch s, as the ledger's times) and when the victim was back."""

    step: Step
    at: float
    back: float = 0.0


# -- records and items ----------------------------------------------------------------------


def doc(ident: int) -> dict[str, Any]:
    """A record or item: 2 ms of work, every tenth fails its first attempt."""
    out: dict[str, Any] = {"id": ident, "sleep": SLEEP_S}
    if ident % 10 == 0:
        out["fail_until"] = 2
    return out


@dataclass
class Feeder:
    """Produces records and enqueues items at steady rates in two threads, until stopped;
    keeps the ids that were confirmed (a record the broker acknowledged, an item whose
    enqueue returned)."""

    settings: Settings
    topic: str
    store: QueueStore
    namespace: str
    queue_topic: str
    records: list[int] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._guarded, args=(f,), daemon=True)
                        for f in (self._produce, self._enqueue)]
        for t in self.threads:
            t.start()

    def finish(self, timeout_s: float = 180.0) -> None:
        """Stop, and wait until what was sent is confirmed."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout_s)
        assert not any(t.is_alive() for t in self.threads), "a feeder did not finish"
        assert not self.errors, self.errors[:3]

    def check(self) -> None:
        """Fails the test at once when a feeder thread failed."""
        assert not self.errors, f"a feeder failed: {self.errors[:3]}"

    def _guarded(self, feed: Callable[[], None]) -> None:
        try:
            feed()
        except Exception as exc:
            self.errors.append(f"{feed.__name__}: {exc!r}")

    def _ticks(self, per_s: int) -> Iterator[int]:
        """Yields how many to send, 4 times a second, until stopped."""
        tick, sent, began = 0.25, 0, time.monotonic()
        while not self.stop.wait(tick):
            due = int((time.monotonic() - began) * per_s)
            if due > sent:
                yield due - sent
                sent = due

    def _produce(self) -> None:
        producer = Producer(self.settings.kafka_config(**{
            "linger.ms": 20, "enable.idempotence": True,
            "message.timeout.ms": 600_000}),  # held through a broker restart
            logger=log)  # "connection refused" while the broker is down: pytest's log
        confirmed: list[int] = []

        def done(err: object, msg: Any) -> None:
            if err is not None:
                self.errors.append(f"record not delivered: {err}")
            else:
                confirmed.append(json.loads(msg.value())["id"])

        ident = 0
        for n in self._ticks(KAFKA_PER_S):
            for _ in range(n):
                producer.produce(self.topic, json.dumps(doc(ident)).encode(),
                                 str(ident).encode(), on_delivery=done)
                ident += 1
            producer.poll(0)
        left = producer.flush(120)
        assert left == 0, f"{left} records not confirmed 120 s after the last"
        self.records = sorted(confirmed)

    def _enqueue(self) -> None:
        ident = QUEUE_BASE
        for n in self._ticks(QUEUE_PER_S):
            chunk = [NewItem(self.queue_topic, json.dumps(doc(i)).encode(), id=str(i))
                     for i in range(ident, ident + n)]
            def stored(chunk: list[NewItem] = chunk) -> bool:
                try:
                    self.store.enqueue(self.namespace, chunk)
                except QueueUnavailable:  # down: the same ids again, none is doubled
                    return False          # (a refusal, QueueError, fails the test)
                return True

            wait_until(stored, 120, "the queue takes items again after PostgreSQL was down",
                       interval=0.5)
            self.items.extend(range(ident, ident + n))
            ident += n


# -- the scenario ---------------------------------------------------------------------------


def successes(calls: list[Call]) -> tuple[int, int]:
    """(records, items) that succeeded at least once."""
    ok = checker.succeeded(calls)
    items = sum(1 for i in ok if i >= QUEUE_BASE)
    return len(ok) - items, items


def duplicates_per_kill(calls: list[Call], kills: list[Kill]) -> list[int]:
    """Successes beyond an id's first, each put on the last kill before it (index 0: before
    the first kill, which should have none)."""
    seen: set[int] = set()
    out = [0] * (len(kills) + 1)
    for c in sorted((c for c in calls if c.kind == "D"), key=lambda c: c.at):
        if c.id in seen:
            out[sum(1 for k in kills if k.at <= c.at)] += 1
        seen.add(c.id)
    return out


def allowed(victim: str) -> int:
    """The duplicates a kill of ``victim`` may cost."""
    return ALLOWED[victim.split("-")[0]]


def pace(feeder: Feeder, seconds: float) -> None:
    """The scenario's own pace (a span of time, not a condition to wait for); it ends at
    once, failing the test, when a feeder thread failed."""
    until = time.monotonic() + max(0.0, seconds)
    wait_until(lambda: feeder.errors or time.monotonic() >= until, seconds + 5,
               "the scenario's pace", interval=0.05)
    feeder.check()


class Chaos:
    """Kills victims by a plan and brings each back as a supervisor would."""

    def __init__(self, plat: FaultPlatform, services: Services, feeder: Feeder) -> None:
        self.plat = plat
        self.services = services
        self.feeder = feeder
        self.kills: list[Kill] = []
        self.began = time.time()

    def run(self, plan: list[Step]) -> None:
        for step in plan:
            kill = Kill(step, time.time())
            self.kills.append(kill)
            print(f"+{kill.at - self.began:6.1f}s  kill {step.victim}", flush=True)
            if step.victim in SERVICES:
                self.services.kill(step.victim)
                pace(self.feeder, step.pause_s)  # the service stays down that long
                self.services.restart(step.victim)
            else:
                self._kill_process(step)
            kill.back = time.time()
            self._progress(step.victim)
            pace(self.feeder, kill.at + step.every_s - time.time())  # the plan's pace

    def _kill_process(self, step: Step) -> None:
        pid = self.plat.procs[step.victim].pid
        self.plat.supervise(step.victim, pause_s=step.pause_s)
        self.plat.kill(step.victim)  # the supervisor starts it again after the pause
        wait_until(lambda: self.plat.procs[step.victim].pid != pid
                   and self.plat.alive(step.victim), step.pause_s + 30,
                   f"the supervisor started {step.victim} again")
        port = self.plat.ports.get(step.victim)
        if port is not None:
            wait_until(lambda: port_answers(port), 30, f"{step.victim} listens again")

    def _progress(self, victim: str, need: int = 20) -> None:
        """Both bindings run again: ``need`` more records and items succeeded."""
        records, items = successes(self.plat.calls())

        def again() -> bool:
            self.feeder.check()  # no progress to wait for once a feeder stopped
            now_records, now_items = successes(self.plat.calls())
            return now_records >= records + need and now_items >= items + need

        wait_until(again, RECOVER_S,
                   f"records and items succeed again after {victim} came back")


def settled(plat: FaultPlatform, feeder: Feeder, store: QueueStore,
            ns: str) -> Callable[[], str]:
    """What is not done yet ('' once every id succeeded, the group is at the end of its
    topic, no delay topic holds a record of the binding and the queue is empty)."""
    topic, group = feeder.topic, plat.settings.names.group("orders")
    want = set(feeder.records) | set(feeder.items)

    def missing() -> str:
        left = want - set(checker.succeeded(plat.calls()))
        if left:
            return f"{len(left)} ids not succeeded (first {sorted(left)[:5]})"
        committed, end = committed_vs_end(plat.settings, group, topic)
        if committed != end:
            return f"group lag {end - committed}"
        if plat.pending("orders", LADDER):
            return "records wait in a delay topic"
        try:
            counts = store.counts(ns, "jobs")
        except QueueUnavailable as exc:
            return f"queue unreadable: {exc}"
        busy = [(c.ready, c.delayed, c.leased, c.dead) for c in counts
                if (c.ready, c.delayed, c.leased, c.dead) != (0, 0, 0, 0)]
        return f"queue (ready, delayed, leased, dead): {busy}" if busy else ""

    return missing


def run_chaos(plan: list[Step], scenario: str, settings: Settings, services: Services,
              tmp_path: Path, fault_results: list[Report]) -> None:
    topic = f"{settings.prefix}.orders"
    ensure_topics(admin(settings), {topic: (4, {})})
    ns = settings.prefix
    plat = FaultPlatform(settings, tmp_path,
                         env={"ASYNCTIER_QUEUE_SHARDS": services.postgres.dsn})
    store = QueueStore(services.postgres.dsn)
    feeder = Feeder(settings, topic, store, ns, "jobs")
    chaos = Chaos(plat, services, feeder)
    try:
        store.migrate()
        plat.bind("orders", topic, *RETRIES)
        plat.cli("bind", "jobs", "--queue", "jobs", "--tenant", ns, "--function", FUNCTION,
                 "--lease", "3s", *RETRIES)
        for name in ("scheduler-a", "scheduler-b"):
            plat.start("scheduler", name)
        plat.start("delay")
        plat.start("tailers", None, "--batch-size", str(BATCH))
        for name in PROCESSES:
            plat.supervise(name, pause_s=SHORT_PAUSE_S)
        feeder.start()
        wait_until(lambda: min(successes(plat.calls())) > 0, 120, "both bindings run")
        pace(feeder, WARMUP_S)  # work under way before the kills
        chaos.run(plan)
        pace(feeder, TAIL_S)
        feeder.finish()
        fed_at = time.time()
        print(f"+{fed_at - chaos.began:6.1f}s  fed {len(feeder.records)} records and "
              f"{len(feeder.items)} items; settling", flush=True)
        missing = settled(plat, feeder, store, ns)
        with contextlib.suppress(AssertionError):  # the checks below say what is missing
            wait_until(lambda: not missing(), SETTLE_S, "the platform settles", interval=1.0)
        print(f"+{time.time() - chaos.began:6.1f}s  settled "
              f"({time.time() - fed_at:.0f} s after the last record)", flush=True)
        result = check(plat, feeder, store, ns, chaos.kills, scenario, fault_results)
        left = missing()
        dead_items = store.dead_items(ns, "jobs")
    finally:
        feeder.stop.set()
        plat.stop_all()
        store.close()
    assert result.ok and not left and not dead_items, \
        f"{result.summary()}; not settled: {left!r}; dead items: {dead_items[:3]}"


def check(plat: FaultPlatform, feeder: Feeder, store: QueueStore, ns: str,
          kills: list[Kill], scenario: str, fault_results: list[Report]) -> Report:
    """The ledger's verdict, with the duplicates per kill printed and in the row's notes."""
    calls = plat.calls()
    dead = plat.dead_letters("orders")
    dead.update({int(d.id): d.reason for d in store.dead_items(ns, "jobs", limit=10_000)})
    ids = feeder.records + feeder.items
    result = checker.check(scenario, ids, calls, dead, plat.pending("orders", LADDER),
                           LADDER, sum(allowed(k.step.victim) for k in kills))
    per_kill = duplicates_per_kill(calls, kills)
    lines = [f"before the first kill: {per_kill[0]}"]
    for n, (k, dups) in enumerate(zip(kills, per_kill[1:], strict=True), 1):
        lines.append(f"kill {n} {k.step.victim} (back in {k.back - k.at:.1f} s): {dups} "
                     f"(allowed {allowed(k.step.victim)})")
    deaths = {name: plat.restarts.get(name, 0) - sum(k.step.victim == name for k in kills)
              for name in PROCESSES}
    own = {name: n for name, n in deaths.items() if n}
    result.notes.append("duplicates per kill: " + "; ".join(lines))
    if own:
        result.notes.append(f"exits not caused by a kill (restarted): {own}")
    fault_results.append(result)
    victims = Counter(k.step.victim for k in kills)
    print(f"\n{scenario}: {len(kills)} kills {dict(victims)}; "
          f"{len(feeder.records)} records, {len(feeder.items)} items")
    print("duplicates per kill:\n  " + "\n  ".join(lines))
    if own:
        print(f"exits not caused by a kill (restarted by the supervisor): {own}")
    print(result.summary())
    return result


def _settings(services: Services, prefix: str) -> Settings:
    return Settings(kafka={"bootstrap.servers": services.kafka.bootstrap},
                    redis_url=services.redis.url, prefix=prefix)


@pytest.mark.timeout(480)
def test_chaos_every_component_killed_in_turn(services: Services, prefix: str,
                                              tmp_path: Path,
                                              fault_results: list[Report]) -> None:
    """The short form: each component SIGKILLed once, in a fixed order, 10 s apart."""
    plan = short_plan()
    print(f"\nchaos: {' -> '.join(s.victim for s in plan)}, every {SHORT_EVERY_S:g} s")
    run_chaos(plan, "chaos: every component SIGKILLed in turn", _settings(services, prefix),
              services, tmp_path, fault_results)


@pytest.mark.slow
@pytest.mark.timeout(int(LONG_S) + 900)
def test_chaos_ten_minutes_of_random_kills(services: Services, prefix: str, tmp_path: Path,
                                           fault_results: list[Report]) -> None:
    """``--long``: 10 minutes of random victims, pauses and intervals from a seed."""
    seed = chaos_seed()
    plan = long_plan(seed)
    print(f"\nchaos seed {seed} (replay: ASYNCTIER_CHAOS_SEED={seed}); {len(plan)} kills: "
          + ", ".join(f"{s.victim} ({s.pause_s:g}/{s.every_s:g} s)" for s in plan),
          flush=True)
    run_chaos(plan, "chaos: 10 min of random SIGKILLs", _settings(services, prefix),
              services, tmp_path, fault_results)


def test_a_duplicate_counts_against_the_last_kill_before_it() -> None:
    """Pure: the second success of an id goes to the kill before it; first successes and
    failures (no ``D`` line) count nowhere."""
    kills = [Kill(Step("tailers", 1.0, 10.0), at=10.0), Kill(Step("redis", 1.0, 10.0), at=20.0)]
    calls = [Call(1, 1, 5.0, "D", 7), Call(1, 1, 12.0, "D", 8), Call(2, 1, 15.0, "S", 8),
             Call(2, 1, 16.0, "D", 8), Call(2, 1, 25.0, "D", 9), Call(3, 1, 26.0, "D", 9)]
    assert duplicates_per_kill(calls, kills) == [0, 1, 1]


def test_a_seed_replays_the_same_plan() -> None:
    """Pure: the long plan is a function of its seed, and covers the time asked for."""
    plan = long_plan(41)
    assert plan == long_plan(41) and plan != long_plan(42)
    assert sum(s.every_s for s in plan) >= LONG_S > sum(s.every_s for s in plan[:-1])
    assert {s.victim for s in plan} <= set(SHORT_ORDER)
    assert all(0.2 <= s.pause_s <= 5.0 and 3.0 <= s.every_s <= 25.0 for s in plan)
