"""The local stack of real services: one Apache Kafka node (KRaft), one Redis, one
PostgreSQL (the queue source's shard) and one Apicurio Registry (registry-framed records).

``asynctier dev up`` and the test harness both use this module. Kafka's jars come from
Maven Central through ``deploy/kafka/pom.xml`` and are cached under
``~/.cache/asynctier/kafka-<version>/libs`` after the first fetch; each service keeps its
data, its configuration, its log and its pid file in a data folder (``.asynctier/`` by
default), so a restart keeps topics, offsets and keys.

Processes are started detached (their own session) and found again through their pid
file, so ``up`` in one shell and ``down`` in another work on the same services.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.jaeger import JaegerNode
from asynctier.dev.kafka import KafkaJars, KafkaNode
from asynctier.dev.postgres import PostgresNode, find_bin_dir
from asynctier.dev.process import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_KAFKA_PORT,
    DEFAULT_POSTGRES_PORT,
    DEFAULT_REDIS_PORT,
    INSTALL_COMMANDS,
    STOP_S,
    Service,
    default_cache_dir,
    free_port,
    port_is_free,
)
from asynctier.dev.redis import RedisNode
from asynctier.dev.registry import (
    DEFAULT_REGISTRY_MANAGEMENT_PORT,
    DEFAULT_REGISTRY_PORT,
    RegistryApp,
    RegistryNode,
)
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

_STATE_FILE = "stack.json"
#: Kafka's own command-line tools (``kafka-configs.sh`` ...) run from the cached jars.
KAFKA_BIN = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "bin"




# --------------------------------------------------------------------------- the stack


@dataclass(frozen=True)
class ServiceStatus:
    """One service's state, as ``up`` and ``status`` report it."""

    name: str
    address: str
    running: bool
    healthy: bool
    started_now: bool = False

    def describe(self) -> str:
        """One line for people."""
        if self.started_now:
            state = "started"
        elif self.healthy:
            state = "already up" if self.running else "up"
        else:
            state = "running but not answering" if self.running else "down"
        return f"{self.name:<6} {self.address:<22} {state}"


@dataclass
class DevStack:
    """Kafka, Redis, PostgreSQL and a schema registry for development, in one data
    folder."""

    data_dir: Path = Path(".asynctier")
    kafka_port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    path: str | None = None  # PATH to look for java, mvn, redis-server, postgres
    postgres_port: int = DEFAULT_POSTGRES_PORT
    #: True when no one chose PostgreSQL's port: ``up`` takes a free one when 5432 is
    #: taken (a system PostgreSQL often holds it), and remembers it.
    postgres_port_auto: bool = False
    #: The registry's API and management ports; taken ones become free ones (unless
    #: chosen), remembered like PostgreSQL's.
    registry_port: int = DEFAULT_REGISTRY_PORT
    registry_management_port: int = DEFAULT_REGISTRY_MANAGEMENT_PORT
    registry_port_auto: bool = False

    @classmethod
    def resolve(cls, data_dir: Path, kafka_port: int | None = None,
                controller_port: int | None = None,
                redis_port: int | None = None,
                postgres_port: int | None = None,
                registry_port: int | None = None) -> DevStack:
        """A stack whose unset ports come from the last ``up`` in ``data_dir``, then the
        defaults."""
        saved = _load_state(data_dir)
        return cls(
            data_dir=data_dir,
            kafka_port=kafka_port or saved.get("kafka_port", DEFAULT_KAFKA_PORT),
            controller_port=controller_port
            or saved.get("controller_port", DEFAULT_CONTROLLER_PORT),
            redis_port=redis_port or saved.get("redis_port", DEFAULT_REDIS_PORT),
            postgres_port=postgres_port or saved.get("postgres_port", DEFAULT_POSTGRES_PORT),
            postgres_port_auto=postgres_port is None and "postgres_port" not in saved,
            registry_port=registry_port or saved.get("registry_port", DEFAULT_REGISTRY_PORT),
            registry_management_port=saved.get("registry_management_port",
                                               DEFAULT_REGISTRY_MANAGEMENT_PORT),
            registry_port_auto=registry_port is None and "registry_port" not in saved,
        )

    @property
    def kafka(self) -> KafkaNode:
        """The Kafka node."""
        jars = KafkaJars(cache_dir=self.cache_dir, path=self.path)
        return KafkaNode(self.data_dir / "kafka", self.kafka_port, self.controller_port,
                         jars=jars, path=self.path)

    @property
    def redis(self) -> RedisNode:
        """The Redis server."""
        return RedisNode(self.data_dir / "redis", self.redis_port, self.redis_password,
                         path=self.path)

    @property
    def postgres(self) -> PostgresNode:
        """The PostgreSQL server (the queue's one shard)."""
        return PostgresNode(self.data_dir / "postgres", self.postgres_port, path=self.path)

    @property
    def registry(self) -> RegistryNode:
        """The schema registry (Apicurio, its Confluent-compatible API)."""
        return RegistryNode(self.data_dir / "registry", self.registry_port,
                            self.registry_management_port,
                            app=RegistryApp(cache_dir=self.cache_dir, path=self.path),
                            path=self.path)

    @property
    def jaeger(self) -> JaegerNode:
        """The traces' backend (``up --with tracing``), on Jaeger's usual ports."""
        return JaegerNode(self.data_dir / "jaeger")

    def services(self) -> tuple[Service, ...]:
        """Kafka, Redis, PostgreSQL and the schema registry (and Jaeger while it runs)."""
        jaeger = self.jaeger
        return (self.kafka, self.redis, self.postgres, self.registry,
                *((jaeger,) if jaeger.running() else ()))

    def up(self, only: Collection[str] | None = None,
           tracing: bool = False) -> list[ServiceStatus]:
        """Start each (those not running yet; with ``only``, those named: ``kafka``,
        ``redis``, ``postgres``, ``registry``; with ``tracing``, Jaeger too) and return
        once all answer."""
        chosen = [s for s in self.services() if only is None or s.name in only]
        if tracing and not any(s.name == "jaeger" for s in chosen):
            chosen.append(self.jaeger)
        names = {s.name for s in chosen}
        self._check_binaries(names)
        if (self.postgres_port_auto and "postgres" in names
                and not self.postgres.running() and not port_is_free(self.postgres_port)):
            self.postgres_port = free_port()
            log.info("port %d is taken: PostgreSQL listens on %d", DEFAULT_POSTGRES_PORT,
                     self.postgres_port)
        if self.registry_port_auto and "registry" in names and not self.registry.running():
            if not port_is_free(self.registry_port):
                self.registry_port = free_port()
            if not port_is_free(self.registry_management_port):
                self.registry_management_port = free_port()
        result = []
        for service in chosen:
            started = service.start()
            self._save_state()
            result.append(ServiceStatus(service.name, service.address, True, True, started))
        return result

    def down(self, timeout_s: float = STOP_S) -> list[tuple[str, bool]]:
        """Stop each; returns (name, was it running) for each."""
        return [(s.name, s.stop(timeout_s)) for s in reversed(self.services())]

    def status(self) -> list[ServiceStatus]:
        """Whether each runs and answers."""
        return [ServiceStatus(s.name, s.address, s.running(), s.healthy())
                for s in self.services()]

    def reset(self) -> None:
        """Stop each and wipe the data folder."""
        self.down()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def env_lines(self) -> list[str]:
        """Shell lines that point asynctier (and its tests) at this stack."""
        return [f"export ASYNCTIER_KAFKA_BOOTSTRAP={self.kafka.bootstrap}",
                f"export ASYNCTIER_REDIS_URL={self.redis.url}",
                f"export ASYNCTIER_QUEUE_SHARDS={self.postgres.dsn}",
                f"export ASYNCTIER_SCHEMA_REGISTRY={self.registry.url}",
                *((f"export OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT="
                   f"{self.jaeger.endpoint}  # traces: {self.jaeger.query_url}",)
                  if self.jaeger.running() else ()),
                f'export PATH="{KAFKA_BIN}:$PATH"',
                # where `asynctier console` listens (its default; change it here)
                "export ASYNCTIER_CONSOLE_LISTEN=127.0.0.1:8089"]

    def _check_binaries(self, names: Collection[str] = ("kafka", "redis", "postgres")) -> None:
        """Every missing binary (of the services ``names``) at once, before anything
        starts."""
        needed = (["java"] if "kafka" in names else []) + \
            (["redis-server"] if "redis" in names else [])
        if "kafka" in names and not self.kafka.jars.is_fetched():
            needed.append("mvn")
        missing = [n for n in needed if shutil.which(n, path=self.path) is None]
        if "postgres" in names:
            try:
                find_bin_dir(self.path)
            except ServiceError:
                missing.append("postgres")
        if missing:
            commands = "; ".join(f"{n}: `{INSTALL_COMMANDS[n]}`" for n in missing)
            raise ServiceError(
                f"missing {', '.join(missing)} on PATH. Install with (as root) {commands}; "
                f"or run scripts/setup.sh"
            )

    def _save_state(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = {"kafka_port": self.kafka_port, "controller_port": self.controller_port,
                 "redis_port": self.redis_port, "postgres_port": self.postgres_port,
                 "registry_port": self.registry_port,
                 "registry_management_port": self.registry_management_port}
        (self.data_dir / _STATE_FILE).write_text(json.dumps(state) + "\n")


def _load_state(data_dir: Path) -> dict[str, int]:
    try:
        raw = json.loads((data_dir / _STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: int(v) for k, v in raw.items() if isinstance(v, int)}


def round_trip(bootstrap: str, topic: str = "asynctier.devcheck",
               timeout_s: float = 30.0) -> int:
    """Produce one record to ``topic`` (created when missing) and read it back.

    Returns the record's offset; raises ServiceError when either side fails.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=timeout_s).topics:
        with contextlib.suppress(KafkaException):  # created meanwhile: fine
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout_s)
    value = uuid.uuid4().bytes
    offsets: list[int | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(topic, value=value, partition=0,
                     on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
    if producer.flush(timeout_s) != 0 or not offsets or offsets[0] is None or offsets[0] < 0:
        raise ServiceError(f"Kafka at {bootstrap} did not confirm a record to {topic}")
    offset = offsets[0]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "asynctier.devcheck",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, offset)])
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.value() == value:
                return offset
    finally:
        consumer.close()
    raise ServiceError(f"the record produced to {topic} did not come back within {timeout_s} s")
