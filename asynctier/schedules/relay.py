"""Kafka-target schedules: each tick's item relayed from the queue to its Kafka topic once.

A schedule ``--topic TOPIC`` fires like any other (:mod:`asynctier.schedules.fire`): its
tick becomes an item, id ``schedule:<name>:<tick>``, exactly once, on the namespace's
outbox queue topic (:data:`~asynctier.schedules.spec.OUTBOX_TOPIC`), with the Kafka topic
and key in its headers. The relay moves those items to Kafka without writing one twice:

- **One relay per shard.** A relay holds a PostgreSQL advisory lock on the shard (its
  session's: a relay that dies lets it go); the others wait for it. Its Kafka producer is
  transactional, ``transactional.id`` one per shard, so a relay that lost its lock but
  still runs (a zombie) is fenced by the next one's ``init_transactions``, which also ends
  whatever transaction the last one left open.
- **A round** leases a batch of outbox items, and in one Kafka transaction writes each
  record and a progress record (the batch's ids and the lease owner, in the compacted
  topic :data:`PROGRESS_TOPIC` keyed by shard); after the commit it acks the batch. The
  topic, the lock and the ``transactional.id`` are the shard's, not a prefix's: the queue
  and its outbox belong to the database, which platforms of several prefixes may share.
- **Recovery.** A relay that starts reads its shard's last committed progress record
  (read_committed) and acks those items, whoever leased them: a relay that died between
  its Kafka commit and its ack had written them. Every earlier batch was acked before
  the next began, so the last one is the only one in doubt.

A transaction Kafka refuses is aborted (nothing of it is visible to a read_committed
consumer, which the tailers are) and its items are given back at once; a commit whose
outcome is unknown is left to the next relay's recovery. Each record carries header
``asynctier.tick-id`` (the item's id), so a function can tell ticks apart.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from asynctier.platform.config import Settings
from asynctier.platform.errors import QueueError, QueueUnavailable
from asynctier.platform.kafka import admin, ensure_topics, producer_config, topic_replication
from asynctier.queue.items import Dead, Leased, Nack, Resolved, check_topic
from asynctier.queue.route import ShardRoute
from asynctier.schedules.spec import OUTBOX_TOPIC, Schedule

log = logging.getLogger(__name__)

#: Headers of an outbox item: the Kafka topic and the record key it is bound for.
H_TOPIC = "asynctier.kafka-topic"
H_KEY = "asynctier.kafka-key"
#: Header of a relayed record: the tick's item id.
H_TICK = "asynctier.tick-id"
#: Items leased per round, and their lease.
BATCH = 500
LEASE_S = 30.0
#: A tick Kafka refuses (its topic deleted, say) is tried again after RETRY_S, and dies
#: (reason ``max_attempts``, the last error kept) after this many tries.
MAX_ATTEMPTS = 20
RETRY_S = 5.0
#: How often an idle relay looks for ticks; how often a relay that waits for the shard's
#: lock asks again.
POLL_S = 0.2
LOCK_RETRY_S = 1.0
#: How long a Kafka transaction step may take before the relay gives up on the round.
TXN_TIMEOUT_S = 30.0


def outbox_headers(schedule: Schedule) -> tuple[tuple[str, bytes], ...]:
    """The headers of a Kafka-target schedule's tick items."""
    return ((H_TOPIC, schedule.topic.encode()), (H_KEY, schedule.name.encode()))


#: The compacted topic of the relays' last committed batch, one key per shard.
PROGRESS_TOPIC = "asynctier.schedule-relay"


def lock_key(shard: str) -> str:
    """The advisory lock text of the shard's relay."""
    return f"asynctier.kafka-relay:{shard}"


class KafkaRelay:
    """The relay of one shard (``route``); :meth:`run` until ``stop`` (under a
    supervisor). ``after_commit`` is called with each batch between its Kafka commit and
    its ack (tests stop a relay there)."""

    def __init__(self, settings: Settings, route: ShardRoute, *, batch: int = BATCH,
                 poll_s: float = POLL_S,
                 after_commit: Callable[[list[tuple[str, Leased]]], None] | None = None
                 ) -> None:
        self.settings = settings
        self.route = route
        self.batch = batch
        self.poll_s = poll_s
        self.after_commit = after_commit
        self.owner = f"kafka-relay:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.topic = PROGRESS_TOPIC
        self.key = route.name.encode()
        #: Records relayed by this relay (tests and logs read it).
        self.relayed = 0
        #: Whether it holds the shard's lock now.
        self.leading = False
        self._waiting = False  # the shard's silence was said

    def run(self, stop: threading.Event) -> None:
        """Wait until the shard has had a Kafka-target tick (a deployment without such
        schedules never talks to Kafka here), then for the shard's lock; then relay until
        ``stop``."""
        while not self._outbox_used():
            if stop.wait(LOCK_RETRY_S):
                return
        with psycopg.connect(self.route.store.dsn, autocommit=True, connect_timeout=5) as lock:
            while not stop.is_set():
                row = lock.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                                   (lock_key(self.route.name),)).fetchone()
                if row is not None and row[0]:
                    break
                stop.wait(LOCK_RETRY_S)
            else:
                return
            self.leading = True
            try:
                self._lead(stop, lock)
            finally:
                self.leading = False

    def _lead(self, stop: threading.Event, lock: psycopg.Connection[Any]) -> None:
        ensure_topics(admin(self.settings),
                      {self.topic: (1, {"cleanup.policy": "compact",
                                        "min.compaction.lag.ms": "0"})},
                      replication=topic_replication(self.settings))
        producer = Producer(producer_config(
            self.settings, **{"transactional.id": f"{self.topic}:{self.route.name}"}))
        producer.init_transactions(TXN_TIMEOUT_S)  # fences an older relay, ends its txn
        self._recover()
        log.info("kafka relay of shard %s running: ticks of Kafka-target schedules go from "
                 "the outbox to their topics", self.route.name)
        while not stop.is_set():
            lock.execute("SELECT 1")  # the lock's session is alive, or this raises
            if not self._round(producer):
                stop.wait(self.poll_s)

    def _recover(self) -> None:
        """Ack the last committed batch of this shard (a relay may have died before)."""
        last = self._last_progress()
        if last is None:
            return
        owner, items = last
        by_ns: dict[str, list[str]] = {}
        for ns, item_id in items:
            by_ns.setdefault(ns, []).append(item_id)
        for ns, ids in by_ns.items():
            done = self._resolve(ns, owner, acks=ids)
            if done.acked:
                log.warning("kafka relay of shard %s: %d tick(s) of namespace %s were written "
                            "to Kafka by a relay that stopped before it acked them; acked "
                            "now, not written again", self.route.name, done.acked, ns)

    def _last_progress(self) -> tuple[str, list[tuple[str, str]]] | None:
        consumer = Consumer(self.settings.kafka_config(**{
            "group.id": f"{self.topic}-reader", "enable.auto.commit": False,
            "isolation.level": "read_committed"}))
        try:
            part = TopicPartition(self.topic, 0, 0)
            low, high = consumer.get_watermark_offsets(part, timeout=TXN_TIMEOUT_S)
            if high <= low:
                return None
            consumer.assign([TopicPartition(self.topic, 0, low)])
            found: Any = None
            deadline = time.monotonic() + TXN_TIMEOUT_S
            while consumer.position([part])[0].offset < high:
                if time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                    f"reading {self.topic} to its end"))
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None:
                    continue
                if msg.key() == self.key:
                    found = msg.value()
            if found is None:
                return None
            doc = json.loads(found)
            return str(doc["owner"]), [(str(ns), str(i)) for ns, i in doc["items"]]
        finally:
            consumer.close()

    def _round(self, producer: Producer) -> int:
        """Relay one batch; how many items it took."""
        taken: list[tuple[str, Leased]] = []
        for ns in self._namespaces():
            if len(taken) >= self.batch:
                break
            taken += [(ns, item) for item in self._lease(ns, self.batch - len(taken))]
        if not taken:
            return 0
        good: list[tuple[str, Leased]] = []
        bad: list[tuple[str, Leased]] = []
        for ns, item in taken:
            (good if _target(item) is not None else bad).append((ns, item))
        for ns, item in bad:
            self._resolve(ns, self.owner, deads=[Dead(item.id, "undecodable",
                                          "an outbox item without a valid Kafka topic header")])
        if good:
            self._relay(producer, good)
        return len(taken)

    def _relay(self, producer: Producer, batch: list[tuple[str, Leased]]) -> None:
        producer.begin_transaction()
        try:
            for ns, item in batch:
                topic, key = _target(item) or ("", None)  # checked by _round
                producer.produce(topic, item.payload, key,
                                 headers=[(H_TICK, item.id.encode()),
                                          ("asynctier.namespace", ns.encode())])
            progress = {"owner": self.owner, "items": [[ns, item.id] for ns, item in batch]}
            producer.produce(self.topic, json.dumps(progress).encode(), self.key)
            producer.commit_transaction(TXN_TIMEOUT_S)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.txn_requires_abort():
                raise  # outcome unknown (or fenced): the next relay's recovery decides
            producer.abort_transaction(TXN_TIMEOUT_S)
            for ns, item in batch:
                self._resolve(ns, self.owner,
                              nacks=[Nack(item.id, RETRY_S, error=f"Kafka: {err.str()}")])
            log.warning("kafka relay of shard %s: Kafka refused a batch of %d tick(s) "
                        "(%s); given back, tried again", self.route.name, len(batch), err.str())
            return
        if self.after_commit is not None:
            self.after_commit(batch)
        for ns in {ns for ns, _ in batch}:
            self._resolve(ns, self.owner, acks=[item.id for n, item in batch if n == ns])
        self.relayed += len(batch)

    def _lease(self, ns: str, n: int) -> list[Leased]:
        return self.route.call(lambda s: s.lease(ns, OUTBOX_TOPIC, n, LEASE_S, self.owner,
                                                 max_attempts=MAX_ATTEMPTS))

    def _resolve(self, ns: str, owner: str, acks: Sequence[str] = (),
                 nacks: Sequence[Nack] = (), deads: Sequence[Dead] = ()) -> Resolved:
        return self.route.call(lambda s: s.resolve(ns, OUTBOX_TOPIC, owner, acks, nacks,
                                                   deads))

    def _outbox_used(self) -> bool:
        """Whether the shard has had outbox items; a shard that does not answer is waited
        for quietly (said once), as the schedule loop does: nothing is relayed from it."""
        try:
            return bool(self._namespaces())
        except QueueUnavailable as exc:
            if not self._waiting:
                self._waiting = True
                log.info("kafka relay: queue shard %s does not answer (%s); nothing is "
                         "relayed from it until it does", self.route.name, exc)
            return False

    def _namespaces(self) -> list[str]:
        return sorted({ns for ns, topic in self.route.call(lambda s: s.topics())
                       if topic == OUTBOX_TOPIC})


def _target(item: Leased) -> tuple[str, bytes | None] | None:
    """(Kafka topic, key) of an outbox item; None when its headers do not name a topic."""
    headers = dict(item.headers)
    raw = headers.get(H_TOPIC)
    try:
        topic = (raw or b"").decode()
        check_topic(topic)
    except (UnicodeDecodeError, QueueError):
        return None
    return topic, headers.get(H_KEY)
