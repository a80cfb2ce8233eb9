"""Small, shared pieces over confluent-kafka: topic admin and a producer that confirms.

Third-party errors are translated here, at the boundary, into asynctier errors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, re-exported
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, HandoffError, ServiceError

log = logging.getLogger(__name__)

HeaderList = list[tuple[str, bytes | None]]


#: librdkafka properties only a consumer reads: an operator's ``[kafka]`` table may hold
#: them for the tailers, and producers and admin clients are not given them (librdkafka
#: would print a CONFWARN line for each, on every client it makes).
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "group.protocol", "group.remote.assignor",
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
    "coordinator.query.interval.ms", "max.poll.interval.ms", "enable.auto.commit",
    "auto.commit.interval.ms", "enable.auto.offset.store", "queued.min.messages",
    "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.queue.backoff.ms",
    "fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes",
    "fetch.min.bytes", "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof",
    "check.crcs", "auto.offset.reset", "consume.callback.max.messages",
})


def client_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """The ``[kafka]`` table for a producer or an admin client (consumer-only keys left
    out), plus ``extra``."""
    conf = {k: v for k, v in settings.kafka.items() if k not in CONSUMER_ONLY}
    conf.update(extra)
    return conf


#: How long a stopping tailer waits for its consumer's ``close()`` (the final commit and
#: leaving the group take well under a second when the broker answers).
CLOSE_TIMEOUT_S = 20.0


def close_consumer(close: Callable[[], None], what: str,
                   timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """Run ``close`` (a consumer's ``close()``) in a thread of its own and wait at most
    ``timeout_s``; return whether it finished.

    librdkafka's ``close()`` can hang for good when the consumer leaves while its group is
    rebalancing (librdkafka issue 2615 and its kin); a tailer told to stop must still stop.
    Nothing is lost by going on: the batches were committed or dropped before, and the
    group drops this member once the process exits (its librdkafka threads may keep it in
    the group until then). The thread is a daemon: a ``close()`` that never returns does
    not keep the process alive.
    """
    done = threading.Event()

    def run() -> None:
        try:
            close()
        except Exception as exc:  # a closed or broken client: nothing left to release
            log.warning("%s: closing the Kafka consumer failed: %s", what, exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"close-{what}", daemon=True).start()
    if done.wait(timeout_s):
        return True
    log.error("%s: the Kafka consumer did not close within %gs (librdkafka can hang when a "
              "consumer leaves during a rebalance); going on without it. Records not "
              "committed are read again once the group drops this member, which happens "
              "after this process exits: if the process keeps running (a binding changed), "
              "restart it when its partitions stay unassigned", what, timeout_s)
    return False


#: How long a stopping tailer polls for the revoke that its ``unsubscribe()`` asks for.
LEAVE_S = 10.0


def leave_group(consumer: Any, owns_any: Callable[[], bool], what: str,
                timeout_s: float = LEAVE_S) -> None:
    """Give every partition back before ``close()``: ``unsubscribe()``, then poll (which
    serves the revoke, in the tailer's own callback, in this thread) until ``owns_any()``
    is false or ``timeout_s`` has passed.

    ``close()`` would serve that revoke itself, and a rebalance callback served inside
    ``close()`` can wait forever in librdkafka (issue 4041: the rebalance protocol, or an
    (un)assign, asked for while the group is shutting down) while confluent-kafka holds the
    GIL: the whole process froze, the close watchdog included. After this the assignment
    is empty, and ``close()`` only leaves the group. Records polled meanwhile are dropped:
    they are not committed, and the partitions' next owner reads them."""
    try:
        consumer.unsubscribe()
    except (KafkaException, RuntimeError) as exc:
        log.warning("%s: unsubscribe failed (%s); closing the consumer as it is", what, exc)
        return
    deadline = time.monotonic() + timeout_s
    while owns_any() and time.monotonic() < deadline:
        try:
            consumer.poll(0.1)
        except (KafkaException, RuntimeError) as exc:
            log.warning("%s: poll while leaving the group failed (%s)", what, exc)
            return
    if owns_any():
        log.warning("%s: the revoke asked for by unsubscribe() did not come within %gs; "
                    "closing the consumer with partitions still assigned", what, timeout_s)


def take_over(consumer: Any, partitions: list[Any], *, assign: bool) -> None:
    """End a rebalance callback the way confluent-kafka's own fallback would, but from here:
    ``incremental_assign`` or ``incremental_unassign`` of ``partitions`` (every tailer is
    incremental: cooperative-sticky, or KIP-848's protocol).

    A callback that leaves the (un)assign to confluent-kafka makes it ask librdkafka for
    the rebalance protocol first: one more request to the group's thread, made while
    holding the GIL, and one that librdkafka may never answer while the group shuts down
    (issue 4041; see :func:`leave_group`). A refused call is logged: the fallback would
    have made the same call (it is not made again: confluent-kafka counts the attempt)."""
    try:
        if assign:
            consumer.incremental_assign(partitions)
        else:
            consumer.incremental_unassign(partitions)
    except KafkaException as exc:
        log.warning("incremental %s of %d partition(s) refused: %s",
                    "assign" if assign else "unassign", len(partitions), exc.args[0].str())


def credential_hint(err: KafkaError) -> str:
    """What to fix in asynctier.toml when ``err`` is an authentication or TLS failure
    (empty otherwise); names settings, never their values."""
    code = err.code()
    if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
        return ("; the broker refused the credentials: check [kafka] sasl.username and "
                "sasl.password (and sasl.mechanism) in asynctier.toml")
    if "bad certificate" in err.str() or "certificate required" in err.str():
        return ("; the broker refused this client's certificate (it requires one its CA "
                "signed): check [kafka] ssl.certificate.location and ssl.key.location in "
                "asynctier.toml")
    if code == KafkaError._SSL or "SSL" in err.str():
        return ("; the TLS connection failed: check [kafka] ssl.ca.location (the CA of the "
                "broker's certificate) and, for client certificates, ssl.certificate.location "
                "and ssl.key.location in asynctier.toml")
    return ""


def consume_error(err: KafkaError, what: str, topic: str) -> None:
    """Log a consume error of a tailer (``what``: "binding b", "delay 30s"); raise a fatal
    one (the tailer stops, or its session restarts); end-of-partition is no error."""
    if err.code() == KafkaError._PARTITION_EOF:
        return
    log.error("%s: consume error on %s: %s%s", what, topic, err.str(), credential_hint(err))
    if err.fatal():
        raise KafkaException(err)


def commit_past(consumer: Any, high: Mapping[tuple[str, int], int],
                owned: Callable[[str, int], bool], sync: bool, what: str) -> list[Any]:
    """Commit past the highest offset of each partition in ``high`` that ``owned`` says is
    still this consumer's (a position committed for a partition another consumer took over
    would move that one's back); the offsets committed. A failure is logged: a later
    commit covers it, or the records are read again."""
    from confluent_kafka import TopicPartition

    offsets = [TopicPartition(t, p, o + 1) for (t, p), o in high.items() if owned(t, p)]
    if not offsets:
        return offsets
    try:
        consumer.commit(offsets=offsets, asynchronous=not sync)
    except KafkaException as exc:
        log.warning("%s: commit of %s failed (%s); those records will be read again", what,
                    ", ".join(f"{o.topic}/{o.partition}@{o.offset}" for o in offsets),
                    exc.args[0].str())
    return offsets


def admin(settings: Settings) -> AdminClient:
    """An AdminClient on the configured cluster; a credentials or TLS failure is logged
    once with the setting to fix."""
    told: set[int] = set()

    def error(err: KafkaError) -> None:
        hint = credential_hint(err)
        if hint and err.code() not in told:
            told.add(err.code())
            log.error("Kafka at %s: %s%s", settings.kafka_bootstrap, err.str(), hint)

    return AdminClient(client_config(settings, error_cb=error))


#: How long a topic just created may take to show in the metadata a broker serves: the
#: controller has it when CreateTopics answers, and the brokers learn it a moment later
#: (0.1-0.5 s on the dev stack under load; every probe right after the answer found it
#: unknown).
VISIBLE_S = 10.0


def _shown(client: AdminClient, topics: list[str], timeout_s: float,
           wait_s: float) -> dict[str, Any]:
    """The metadata of each of ``topics`` that the cluster shows, looked up again for up to
    ``wait_s`` until every one of them does."""
    deadline = time.monotonic() + wait_s
    one = topics[0] if len(topics) == 1 else None
    while True:
        listed = client.list_topics(topic=one, timeout=timeout_s).topics
        shown = {t: listed[t] for t in topics if t in listed and listed[t].error is None}
        if len(shown) == len(topics) or time.monotonic() >= deadline:
            return shown
        time.sleep(0.05)


def topic_partitions(client: AdminClient, topic: str, timeout_s: float = 10.0,
                     wait_s: float = 0.0) -> int | None:
    """How many partitions ``topic`` has, or None when it does not exist (looked up again
    for up to ``wait_s``: a topic that another tool has just created shows a moment
    later)."""
    meta = _shown(client, [topic], timeout_s, wait_s).get(topic)
    return None if meta is None else len(meta.partitions)


def _wait_visible(client: AdminClient, topics: list[str], timeout_s: float) -> None:
    """Return once every topic of ``topics`` shows in the metadata, or after ``timeout_s``
    (then with a warning: the topics exist, and their users wait for them)."""
    missing = set(topics) - set(_shown(client, topics, timeout_s, timeout_s))
    if missing:
        log.warning("created topic(s) %s do not show in the cluster's metadata after %gs; "
                    "whatever uses them waits until they do", ", ".join(sorted(missing)),
                    timeout_s)


@dataclass(frozen=True)
class Replication:
    """The replication of the topics the platform creates; 0 leaves it to
    :func:`replication_for` (``[asynctier] topic_replication_factor`` and
    ``topic_min_insync_replicas``)."""

    factor: int = 0
    min_insync: int = 0


def topic_replication(settings: Settings) -> Replication:
    """The replication the settings ask for."""
    return Replication(settings.topic_replication_factor, settings.topic_min_insync_replicas)


def replication_for(brokers: int, wanted: Replication) -> tuple[int, dict[str, str]]:
    """The replication factor and the configs of a new topic on ``brokers`` brokers.

    Unset (0): 3 replicas and ``min.insync.replicas=2`` on a cluster of 3 brokers or more
    (a record acknowledged by ``acks=all`` is on two brokers at least, and one broker may
    be down); below 3 brokers the broker's own ``default.replication.factor`` (-1). An
    unset ``min_insync`` is 2 for 3 replicas or more, else the broker's default.
    """
    factor = wanted.factor or (3 if brokers >= 3 else -1)
    min_insync = wanted.min_insync or (2 if factor >= 3 else 0)
    if factor > brokers:
        raise AsynctierError(
            f"topic_replication_factor {factor} is more than the {brokers} broker(s) of the "
            "cluster: lower [asynctier] topic_replication_factor "
            "(ASYNCTIER_TOPIC_REPLICATION_FACTOR) or add brokers")
    if min_insync and factor > 0 and min_insync > factor:
        raise AsynctierError(
            f"topic_min_insync_replicas {min_insync} is more than the replication factor "
            f"{factor}: no write could ever be acknowledged; lower [asynctier] "
            "topic_min_insync_replicas (ASYNCTIER_TOPIC_MIN_INSYNC_REPLICAS)")
    return factor, ({"min.insync.replicas": str(min_insync)} if min_insync else {})


def ensure_topics(client: AdminClient, topics: Mapping[str, tuple[int, Mapping[str, str]]],
                  timeout_s: float = 30.0, replication: Replication | None = None) -> list[str]:
    """Create each missing topic (name -> (partitions, configs)); return the ones created,
    once the cluster's metadata shows them (see :data:`VISIBLE_S`). Each is replicated as
    :func:`replication_for` says for the cluster's brokers (a config given for a topic
    wins).

    A topic that already exists is left as it is.
    """
    try:
        metadata = client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        err = exc.args[0]
        client.poll(0)  # serves the error callback: a refused login is logged with its fix
        raise ServiceError(f"Kafka did not answer a metadata request within {timeout_s:g}s "
                           f"({err.str()}): check that it runs at [kafka] bootstrap.servers"
                           f"{credential_hint(err) or ', and its credentials (see the log)'}"
                           ) from exc
    existing = set(metadata.topics)
    factor, base = replication_for(len(metadata.brokers), replication or Replication())
    wanted = [NewTopic(name, num_partitions=parts, replication_factor=factor,
                       config={**base, **conf})
              for name, (parts, conf) in topics.items() if name not in existing]
    if not wanted:
        return []
    created = []
    for name, future in client.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise AsynctierError(f"could not create topic {name}: {exc.args[0].str()}") from exc
    _wait_visible(client, [t.topic for t in wanted], VISIBLE_S)
    return created


def raise_topic_minimums(client: AdminClient, minimums: Mapping[str, Mapping[str, int]],
                         timeout_s: float = 30.0) -> list[str]:
    """Raise each numeric config below its least value (topic -> {config: least value});
    return what changed, as ``topic config old->new``.

    For topics the platform made before it wanted more of them: a dead-letter topic created
    with 8 MB of ``max.message.bytes`` where one now takes any record a scheduler can run.
    A higher value is kept. A topic whose configs cannot be read or changed (no ACL for it,
    say) is used as it is, with a warning that gives the command to run.
    """
    if not minimums:
        return []
    changed: list[str] = []
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in minimums]
    for resource, future in client.describe_configs(resources,
                                                    request_timeout=timeout_s).items():
        topic = resource.name
        try:
            entries = future.result()
            low = [(name, int(entries[name].value), least)
                   for name, least in minimums[topic].items()
                   if name in entries and int(entries[name].value) < least]
            if not low:
                continue
            alter = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
                ConfigEntry(name, str(least), incremental_operation=AlterConfigOpType.SET)
                for name, _, least in low])
            for done in client.incremental_alter_configs(
                    [alter], request_timeout=timeout_s).values():
                done.result()
        except (KafkaException, ValueError, TypeError) as exc:
            detail = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            configs = ",".join(f"{n}={v}" for n, v in minimums[topic].items())
            log.warning("topic %s: could not check or raise %s (%s); it is used as it is. "
                        "Raise it yourself: kafka-configs.sh --alter --entity-type topics "
                        "--entity-name %s --add-config %s", topic, configs, detail, topic,
                        configs)
            continue
        for name, old, least in low:
            log.info("topic %s: raised %s from %d to %d", topic, name, old, least)
            changed.append(f"{topic} {name} {old}->{least}")
    return changed


#: What at-least-once rests on: never overridden by the ``[kafka]`` table.
_SAFETY = {"enable.auto.commit": False, "enable.auto.offset.store": False}


def tailer_consumer_config(settings: Settings, group: str, *, session_timeout_ms: int,
                           max_poll_interval_ms: int, fetch_wait_max_ms: int,
                           queued_max_kbytes: int,
                           fetch_max_bytes: int | None = None) -> dict[str, Any]:
    """The consumer settings of every tailer (main and delay).

    The arguments are defaults that the operator's ``[kafka]`` table may tune (for example
    ``session.timeout.ms``); the group and the commit settings that at-least-once rests on
    (no auto commit, no auto offset store) are always ours.
    """
    conf: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session_timeout_ms,
        "max.poll.interval.ms": max_poll_interval_ms,
        "fetch.wait.max.ms": fetch_wait_max_ms,
        "queued.max.messages.kbytes": queued_max_kbytes,
        # When the read-ahead is full, fetch again soon after it drains, not a second
        # later (librdkafka's default backoff): a bounded read-ahead must not stall reading.
        "fetch.queue.backoff.ms": 5,
    }
    if fetch_max_bytes is not None:
        conf["fetch.max.bytes"] = fetch_max_bytes
    kip_848 = str(settings.kafka.get("group.protocol", "classic")).lower() == "consumer"
    if kip_848:
        # KIP-848: the broker assigns partitions and sets the session's timeouts; the
        # client may not set them
        del conf["partition.assignment.strategy"], conf["session.timeout.ms"]
    conf.update(settings.kafka)
    conf.update(_SAFETY)
    # The tailers' rebalance callbacks are incremental: an eager strategy breaks them, and
    # KIP-848 groups take none (the broker assigns).
    wanted = None if kip_848 else "cooperative-sticky"
    theirs = conf.pop("partition.assignment.strategy", None)
    if theirs != wanted:
        log.warning("[kafka] partition.assignment.strategy = %r is not used by the tailers: "
                    "they need cooperative-sticky (or group.protocol = \"consumer\", "
                    "without a strategy)", theirs)
    if wanted is not None:
        conf["partition.assignment.strategy"] = wanted
    conf["group.id"] = group
    return conf


#: The largest record a dead-letter topic takes: as large as one submit call may be (a
#: record larger than that can never run), so a failing record always has a place there.
DLQ_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: The platform's producer defaults; the operator's ``[kafka]`` table may tune any of them.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",  # also forced by producer_config, whatever the [kafka] table says
    "linger.ms": 5,
    "compression.type": "lz4",
    # The topic's own max.message.bytes is the limit that counts (8 MB for a delay topic,
    # checked by Handoff before it writes one); the producer lets a dead letter that size
    # through.
    "message.max.bytes": DLQ_MAX_MESSAGE_BYTES + 1024 * 1024,
}


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """A :class:`ConfirmingProducer`'s settings: :data:`PRODUCER_DEFAULTS`, then the
    operator's ``[kafka]`` table (consumer-only keys left out), then ``extra``; only failed
    deliveries are reported, always (``flush()`` waits for every record either way, and no
    Python call is made per delivered record)."""
    conf = {**PRODUCER_DEFAULTS, **client_config(settings), **extra}
    if str(conf.get("acks", "all")) not in ("all", "-1"):
        log.warning("[kafka] acks=%s is ignored: the platform's producers (hand-offs, dead "
                    "letters) wait for every in-sync replica (acks=all)", conf["acks"])
    conf["acks"] = "all"  # a hand-off is confirmed only once min.insync.replicas have it
    conf["delivery.report.only.error"] = True
    return conf


#: Any partition (librdkafka's RD_KAFKA_PARTITION_UA): the client's partitioner chooses.
PRODUCE_ANY_PARTITION: Final = -1


def produce_by_position(produce: Callable[..., None], topic: str, value: bytes | None,
                        key: bytes | None, partition: int, timestamp_ms: int,
                        headers: list[tuple[str, bytes | None]] | None) -> None:
    """``produce(topic, value, key, partition=, timestamp=, headers=)`` with every argument
    by position, in the client's own order (``callback`` and ``on_delivery`` left to the
    default). The client looks each keyword up by name, a cost a retry flood pays per
    record (``python -m bench.handoff_cost``)."""
    produce(topic, value, key, partition, None, None, timestamp_ms, headers)


class ConfirmingProducer:
    """A producer whose :meth:`confirm` says whether everything produced since was delivered.

    Every ``produce()`` is tracked; :meth:`confirm` flushes and raises HandoffError unless
    ``flush()`` returned 0 and every delivery report was good. Synchronous ``produce()``
    errors (queue full) are handled by polling; others are raised as HandoffError.
    """

    def __init__(self, settings: Settings, **extra: Any) -> None:
        conf = producer_config(settings, **extra)
        conf["on_delivery"] = self._on_delivery
        self._producer = Producer(conf)
        #: The client's own ``produce`` (raises BufferError when its queue is full, and
        #: KafkaException): for hot loops that fall back to :meth:`produce` on either.
        self.client_produce = self._producer.produce
        self._errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()}")

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None,
                timestamp_ms: int = 0, partition: int = PRODUCE_ANY_PARTITION) -> None:
        """Queue one record (to ``partition``, else where the client's partitioner puts
        it); its delivery is checked by the next :meth:`confirm`."""
        while True:
            try:
                produce_by_position(self._producer.produce, topic, value, key, partition,
                                    timestamp_ms, headers or None)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0]
                if (partition != PRODUCE_ANY_PARTITION
                        and err.code() == KafkaError._UNKNOWN_PARTITION):
                    partition = PRODUCE_ANY_PARTITION  # the topic has fewer partitions now
                    continue
                raise HandoffError(f"could not produce to {topic}: {err.str()}") from exc

    def partition_count(self, topic: str, timeout_s: float = 2.0) -> int | None:
        """How many partitions ``topic`` has, from the broker; None when it could not
        tell (no such topic, or no answer in ``timeout_s``)."""
        try:
            meta = self._producer.list_topics(topic, timeout=timeout_s)
        except KafkaException:
            return None
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return len(found.partitions)

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports."""
        self._producer.poll(timeout_s)

    def confirm(self, timeout_s: float = 30.0) -> None:
        """Wait until everything produced so far is delivered; raise HandoffError if not."""
        left = self._producer.flush(timeout_s)
        errors, self._errors = self._errors, []
        if left or errors:
            detail = "; ".join(errors[:3]) + (f" (+{len(errors) - 3} more)"
                                               if len(errors) > 3 else "")
            raise HandoffError(
                f"{left} record(s) still undelivered and {len(errors)} delivery failure(s)"
                + (f": {detail}" if detail else ""))

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is left."""
        self._producer.flush(timeout_s)
