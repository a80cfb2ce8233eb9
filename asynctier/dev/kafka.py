"""One Apache Kafka 4.x node (KRaft, broker and controller in one process) from Maven
Central jars, cached under ``~/.cache/asynctier/kafka-<version>/libs``."""

from __future__ import annotations

import base64
import logging
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.process import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_KAFKA_PORT,
    FETCH_S,
    HOST,
    KAFKA_READY_S,
    Daemon,
    DaemonNode,
    TlsFiles,
    default_cache_dir,
    default_pom,
    ensure_ports_free,
    file_lock,
    port_answers,
    require_binary,
    sha256_of,
    wait_ready,
)
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)




# --------------------------------------------------------------------------- Kafka jars


def pom_kafka_version(pom: Path) -> str:
    """The ``kafka.version`` property of the broker's pom.xml."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if match is None:
        raise ServiceError(f"{pom} has no <kafka.version> property")
    return match.group(1).strip()


@dataclass(frozen=True)
class KafkaJars:
    """The Kafka broker's jars, resolved by Maven once and cached."""

    pom: Path = field(default_factory=default_pom)
    cache_dir: Path = field(default_factory=default_cache_dir)
    path: str | None = None  # PATH used to look for mvn (None: the process's own)

    @property
    def home(self) -> Path:
        """``<cache>/kafka-<version>``."""
        return self.cache_dir / f"kafka-{pom_kafka_version(self.pom)}"

    @property
    def libs(self) -> Path:
        """The folder that holds every runtime jar."""
        return self.home / "libs"

    @property
    def classpath(self) -> str:
        """The JVM classpath (a wildcard the JVM expands)."""
        return f"{self.libs}/*"

    def _marker(self) -> Path:
        return self.home / ".fetched"

    def is_fetched(self) -> bool:
        """True when the cache holds the jars of exactly this pom."""
        marker = self._marker()
        return marker.is_file() and marker.read_text().strip() == sha256_of(self.pom)

    def ensure(self) -> Path:
        """Fetch the jars when they are not cached yet; returns the libs folder."""
        if not self.pom.is_file():
            raise ServiceError(f"the Kafka broker's pom.xml is missing: {self.pom}")
        if self.is_fetched():
            return self.libs
        self.home.mkdir(parents=True, exist_ok=True)
        with file_lock(self.home / ".lock"):
            if not self.is_fetched():
                self._fetch()
        return self.libs

    def _fetch(self) -> None:
        mvn = require_binary("mvn", self.path)
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=self.home))
        argv = [mvn, "-q", "-B", "-f", str(self.pom), "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}"]
        log.info("fetching Kafka's jars with Maven into %s", self.libs)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ServiceError(f"Maven did not fetch Kafka's jars within {FETCH_S:.0f} s") from exc
        if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            output = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise ServiceError(f"Maven could not fetch Kafka's jars ({' '.join(argv)}):\n{output}")
        shutil.rmtree(self.libs, ignore_errors=True)
        staging.rename(self.libs)
        self._marker().write_text(sha256_of(self.pom) + "\n")


def kafka_cluster_id() -> str:
    """A new cluster id in Kafka's format (16 random bytes, URL-safe base64, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def kafka_answers(bootstrap: str, timeout_s: float = 3.0,
                  config: Mapping[str, str] | None = None) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` returns at least one broker.

    ``config``: more client properties (``security.protocol``, ``sasl.*`` ...)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0,
                         "socket.connection.setup.timeout.ms": 2000, **(config or {})})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception:  # KafkaException and friends: not ready
        return False
    return bool(metadata.brokers)


_LOG4J2 = """\
status = warn
shutdownHook = disable
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


@dataclass
class KafkaNode(DaemonNode):
    """One Kafka 4.x node in KRaft combined mode (broker and controller), data kept in
    ``data_dir``."""

    data_dir: Path
    port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    jars: KafkaJars = field(default_factory=KafkaJars)
    path: str | None = None  # PATH used to look for java (None: the process's own)
    #: Kafka's own default (kafka-server-start.sh). With 512 MB the broker ran out of heap
    #: taking a 70 MB record (a dead letter may be 64 MB) after a few suites' worth of work.
    heap: str = "1g"
    name: str = "kafka"
    #: user -> password: the client listener speaks SASL_PLAINTEXT with PLAIN (the first
    #: user is also the broker's own); None: PLAINTEXT without authentication.
    sasl_plain_users: dict[str, str] | None = None
    #: One node of a cluster (see .kafka_cluster): its id, the controller quorum's voters
    #: (``id@host:port,...``; None: a standalone node), the cluster's id (formatted with
    #: it), and the replication factor of the broker's internal topics.
    node_id: int = 1
    voters: str | None = None
    cluster_id: str | None = None
    internal_replication: int = 1
    #: PEM files (CA, certificate, key): the client listener speaks TLS (SSL, requiring a
    #: client certificate the CA signed; SASL_SSL with ``sasl_plain_users``).
    tls: TlsFiles | None = None

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()  # the broker runs with cwd=data_dir

    @property
    def protocol(self) -> str:
        """The client listener's security.protocol."""
        sasl, tls = bool(self.sasl_plain_users), self.tls is not None
        return {(False, False): "PLAINTEXT", (True, False): "SASL_PLAINTEXT",
                (False, True): "SSL", (True, True): "SASL_SSL"}[(sasl, tls)]

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """The librdkafka properties a client needs here (SASL and SSL ones as the listener
        speaks them; with SSL alone, the TLS files' certificate as the client's)."""
        conf = {"bootstrap.servers": self.bootstrap}
        if self.protocol != "PLAINTEXT":
            conf["security.protocol"] = self.protocol
        if self.tls is not None:
            conf["ssl.ca.location"] = str(self.tls.ca)
            if not self.sasl_plain_users:
                conf["ssl.certificate.location"] = str(self.tls.cert)
                conf["ssl.key.location"] = str(self.tls.key)
        if self.sasl_plain_users:
            user = user or next(iter(self.sasl_plain_users))
            conf.update({"sasl.mechanism": "PLAIN", "sasl.username": user,
                         "sasl.password": self.sasl_plain_users[user]})
        return conf

    @property
    def address(self) -> str:
        """The bootstrap servers string."""
        return f"{HOST}:{self.port}"

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers string (same as :attr:`address`)."""
        return self.address

    @property
    def daemon(self) -> Daemon:
        """The broker's process."""
        return Daemon("Kafka", self.data_dir / "kafka.pid", self.data_dir / "kafka.out",
                      "kafka.Kafka")

    @property
    def server_log(self) -> Path:
        """The broker's own log (log4j2, WARN and up)."""
        return self.data_dir / "server.log"

    @property
    def properties_file(self) -> Path:
        """The generated ``server.properties``."""
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        """Where the broker keeps topic data and ``meta.properties``."""
        return self.data_dir / "data"

    def running(self) -> bool:
        """True when the broker's process runs."""
        return self.daemon.pid() is not None

    def healthy(self) -> bool:
        """True when the broker answers a metadata request."""
        if self.tls is None:
            return port_answers(self.port) and kafka_answers(self.bootstrap,
                                                             config=self.client_config())
        # a TLS (and SASL) handshake with a JVM warming up on a busy machine takes seconds
        slow = {**self.client_config(), "socket.connection.setup.timeout.ms": "15000"}
        return port_answers(self.port) and kafka_answers(self.bootstrap, 15.0, slow)

    def start(self) -> bool:
        """Fetch jars if needed, format once, start the broker and wait until it answers.

        Returns False (and does nothing) when it already runs.
        """
        started = self.launch()
        self.wait()
        return started

    def wait(self) -> None:
        """Wait until the broker answers a metadata request."""
        wait_ready("Kafka", self.healthy, self.daemon, KAFKA_READY_S, self.server_log)

    def launch(self) -> bool:
        """Fetch jars if needed, format once and start the broker, without waiting for it
        (the nodes of a cluster answer only once a quorum of them runs)."""
        if self.running():
            return False
        java = self.prepare()
        self.daemon.start(self._java_argv(java, "kafka.Kafka", str(self.properties_file)),
                          cwd=self.data_dir)
        return True

    def prepare(self) -> str:
        """Fetch jars if needed, write the config and format the storage once; the path
        of java. A cluster prepares every node before it starts any (a started node
        waits for its quorum only so long)."""
        java = require_binary("java", self.path)
        ensure_ports_free({"Kafka": self.port, "Kafka controller": self.controller_port})
        self.jars.ensure()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._format(java)
        return java




    def _java_argv(self, java: str, *main: str) -> list[str]:
        return [java, f"-Xmx{self.heap}", "-Xms256m", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", self.jars.classpath, *main]

    def _write_config(self) -> None:
        self.properties_file.write_text(self._properties())
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log=self.server_log))

    def _properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.bootstrap.servers": f"{HOST}:{self.controller_port}",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(self.internal_replication),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(self.internal_replication),
            "transaction.state.log.min.isr": str(min(2, self.internal_replication)),
            "share.coordinator.state.topic.replication.factor": str(self.internal_replication),
            "share.coordinator.state.topic.min.isr": str(min(2, self.internal_replication)),
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "168",
            # Groups on KIP-848's protocol (group.protocol=consumer) get their session
            # and heartbeat from the broker: the short ones the tests' classic groups
            # ask for themselves (6 s, 1 s), so a killed tailer's partitions move on soon.
            "group.consumer.min.session.timeout.ms": "6000",
            "group.consumer.session.timeout.ms": "6000",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.consumer.heartbeat.interval.ms": "1000",
        }
        if self.voters is not None:
            del props["controller.quorum.bootstrap.servers"]
            props["controller.quorum.voters"] = self.voters
            # the other nodes may take minutes to start on a loaded machine (default 60 s)
            props["initial.broker.registration.timeout.ms"] = "300000"
        if self.sasl_plain_users:
            props.update(self._sasl_properties())
        if self.tls is not None:
            props.update(self._tls_properties())
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _tls_properties(self) -> dict[str, str]:
        """The client listener on TLS: PEM files (the key PKCS#8, unencrypted)."""
        assert self.tls is not None
        name, kind = self.protocol, self.protocol.lower()
        keystore = self.data_dir / "keystore.pem"  # Kafka's PEM keystore: key, then chain
        keystore.write_bytes(self.tls.key.read_bytes() + self.tls.cert.read_bytes())
        keystore.chmod(0o600)
        props = {
            "listeners": f"{name}://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"{name}://{HOST}:{self.port}",
            "listener.security.protocol.map": f"{name}:{name},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": name,
            f"listener.name.{kind}.ssl.keystore.type": "PEM",
            f"listener.name.{kind}.ssl.keystore.location": str(keystore),
            f"listener.name.{kind}.ssl.truststore.type": "PEM",
            f"listener.name.{kind}.ssl.truststore.location": str(self.tls.ca),
            f"listener.name.{kind}.ssl.client.auth": "none" if self.sasl_plain_users
                                                     else "required",
        }
        if self.sasl_plain_users:
            jaas = self._sasl_properties()["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
            props["listener.name.sasl_ssl.plain.sasl.jaas.config"] = jaas
        return props

    def _sasl_properties(self) -> dict[str, str]:
        users = self.sasl_plain_users or {}
        admin_user, admin_password = next(iter(users.items()))
        jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin_user}" password="{admin_password}" '
                + " ".join(f'user_{u}="{p}"' for u, p in users.items()) + ";")
        return {
            "listeners": f"SASL_PLAINTEXT://{HOST}:{self.port},"
                         f"CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"SASL_PLAINTEXT://{HOST}:{self.port}",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                              "CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        }

    def _format(self, java: str) -> None:
        """Format the log folder once (skipped when ``meta.properties`` exists)."""
        if (self.log_dir / "meta.properties").exists():
            self._check_controller_port()
            return
        alone = ["--standalone"] if self.voters is None else []
        argv = self._java_argv(java, "kafka.tools.StorageTool", "format", *alone,
                               "-t", self.cluster_id or kafka_cluster_id(),
                               "-c", str(self.properties_file))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ServiceError(f"formatting Kafka's storage failed:\n{done.stdout}{done.stderr}")
        (self.data_dir / "controller.port").write_text(f"{self.controller_port}\n")

    def _check_controller_port(self) -> None:
        saved = self.data_dir / "controller.port"
        if saved.is_file() and saved.read_text().strip() != str(self.controller_port):
            raise ServiceError(
                f"the Kafka data in {self.data_dir} was formatted for controller port "
                f"{saved.read_text().strip()}, not {self.controller_port}: use that port or "
                f"reset the data"
            )
