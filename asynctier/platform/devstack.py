"""The local stack of real services: one Apache Kafka node (KRaft) and one Redis.

``asynctier dev up`` and the test harness both use this module. Kafka's jars come from
Maven Central through ``deploy/kafka/pom.xml`` and are cached under
``~/.cache/asynctier/kafka-<version>/libs`` after the first fetch; each service keeps its
data, its configuration, its log and its pid file in a data folder (``.asynctier/`` by
default), so a restart keeps topics, offsets and keys.

Processes are started detached (their own session) and found again through their pid
file, so ``up`` in one shell and ``down`` in another work on the same services.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
DEFAULT_REDIS_PORT = 6379
KAFKA_READY_S = 90.0
REDIS_READY_S = 20.0
STOP_S = 30.0
FETCH_S = 900.0

#: The exact command that installs each binary the stack needs (Debian / Ubuntu).
INSTALL_COMMANDS = {
    "java": "apt-get install -y openjdk-17-jre-headless",
    "mvn": "apt-get install -y maven",
    "redis-server": "apt-get install -y redis-server",
}

_STATE_FILE = "stack.json"


# --------------------------------------------------------------------------- small tools


def default_cache_dir() -> Path:
    """Where fetched Kafka jars live: ``$ASYNCTIER_CACHE_DIR`` or ``~/.cache/asynctier``."""
    env = os.environ.get("ASYNCTIER_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "asynctier"


def default_pom() -> Path:
    """``deploy/kafka/pom.xml`` of this checkout (``$ASYNCTIER_KAFKA_POM`` overrides it)."""
    env = os.environ.get("ASYNCTIER_KAFKA_POM")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "pom.xml"


def require_binary(name: str, path: str | None = None) -> str:
    """The full path of ``name`` on ``path`` (default ``$PATH``), or a ServiceError that
    gives the command that installs it."""
    found = shutil.which(name, path=path)
    if found is None:
        install = INSTALL_COMMANDS.get(name, f"install {name}")
        raise ServiceError(
            f"{name} is not installed (not found on PATH): install it with "
            f"`{install}` (as root), or run scripts/setup.sh"
        )
    return found


def free_port(host: str = HOST) -> int:
    """A TCP port that nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_answers(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def ensure_ports_free(ports: Mapping[str, int], host: str = HOST) -> None:
    """Raise a ServiceError naming the first port in ``ports`` that is already taken."""
    for what, port in ports.items():
        if not port_is_free(port, host):
            raise ServiceError(
                f"port {port} ({what}) on {host} is already in use by another process: "
                f"stop it or choose another port"
            )


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (None when unknown or gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def process_cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` ([] when it is gone or /proc is not there)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pid_alive(pid: int) -> bool:
    """True when ``pid`` runs (a zombie child is reaped and counts as gone)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) != "Z"


@dataclass
class Daemon:
    """One detached process known by its pid file, its log file and a command marker.

    ``marker`` is a word of its command line (``kafka.Kafka``, ``redis-server``) that tells
    our process apart from another that got the same pid after a reboot.
    """

    name: str
    pid_file: Path
    log_file: Path
    marker: str

    def pid(self) -> int | None:
        """The pid of the running process, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and self._is_ours(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def _is_ours(self, pid: int) -> bool:
        cmdline = process_cmdline(pid)
        return not cmdline or any(self.marker in part for part in cmdline)

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> int:
        """Start ``argv`` detached, output appended to the log file; returns its pid."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(env) if env is not None else None,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """SIGTERM, wait up to ``timeout_s``, SIGKILL only as a last resort.

        Returns True when a process was stopped, False when none was running.
        """
        pid = self.pid()
        if pid is None:
            return False
        self._signal(pid, signal.SIGTERM)
        if not _wait_gone(pid, timeout_s):
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it",
                        self.name, pid, timeout_s)
            self._signal(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self) -> bool:
        """SIGKILL at once (a crash, for fault tests); True when a process was killed."""
        pid = self.pid()
        if pid is None:
            return False
        self._signal(pid, signal.SIGKILL)
        _wait_gone(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def _wait_ready(what: str, ready: Callable[[], bool], daemon: Daemon, timeout_s: float,
                extra_log: Path | None = None) -> None:
    """Poll ``ready`` until it is True; fail early when the process dies."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while time.monotonic() < deadline:
        if ready():
            return
        if daemon.pid() is None:
            raise ServiceError(f"{what} exited while starting:\n{_logs(daemon, extra_log)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    raise ServiceError(
        f"{what} did not answer within {timeout_s:.0f} s:\n{_logs(daemon, extra_log)}"
    )


def _logs(daemon: Daemon, extra_log: Path | None) -> str:
    parts = [f"--- {daemon.log_file} ---\n{tail(daemon.log_file)}"]
    if extra_log is not None:
        parts.append(f"--- {extra_log} ---\n{tail(extra_log)}")
    return "\n".join(parts)


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
        return marker.is_file() and marker.read_text().strip() == _sha256(self.pom)

    def ensure(self) -> Path:
        """Fetch the jars when they are not cached yet; returns the libs folder."""
        if not self.pom.is_file():
            raise ServiceError(f"the Kafka broker's pom.xml is missing: {self.pom}")
        if self.is_fetched():
            return self.libs
        self.home.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.home / ".lock"):
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
        self._marker().write_text(_sha256(self.pom) + "\n")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- services


class Service(Protocol):
    """What the stack needs from each of its services."""

    name: str

    @property
    def address(self) -> str:
        """Where clients reach it."""
        ...

    def running(self) -> bool:
        """True when its process runs."""
        ...

    def healthy(self) -> bool:
        """True when it answers."""
        ...

    def start(self) -> bool:
        """Start it (no-op when up); True when it was started now."""
        ...

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """Stop it; True when it was running."""
        ...


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
class KafkaNode:
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

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()  # the broker runs with cwd=data_dir

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """The librdkafka properties a client needs here (SASL ones with a SASL listener)."""
        if not self.sasl_plain_users:
            return {"bootstrap.servers": self.bootstrap}
        user = user or next(iter(self.sasl_plain_users))
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": user,
                "sasl.password": self.sasl_plain_users[user]}

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
        return port_answers(self.port) and kafka_answers(self.bootstrap,
                                                         config=self.client_config())

    def start(self) -> bool:
        """Fetch jars if needed, format once, start the broker and wait until it answers.

        Returns False (and does nothing) when it already runs.
        """
        if self.running():
            _wait_ready("Kafka", self.healthy, self.daemon, KAFKA_READY_S, self.server_log)
            return False
        java = require_binary("java", self.path)
        ensure_ports_free({"Kafka": self.port, "Kafka controller": self.controller_port})
        self.jars.ensure()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._format(java)
        self.daemon.start(self._java_argv(java, "kafka.Kafka", str(self.properties_file)),
                          cwd=self.data_dir)
        _wait_ready("Kafka", self.healthy, self.daemon, KAFKA_READY_S, self.server_log)
        return True

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """Controlled shutdown (SIGTERM, wait, SIGKILL last); data is kept."""
        return self.daemon.stop(timeout_s)

    def kill(self) -> bool:
        """SIGKILL the broker (a crash); data is kept."""
        return self.daemon.kill()

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data."""
        self.stop()
        self.start()

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
            "node.id": "1",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.bootstrap.servers": f"{HOST}:{self.controller_port}",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
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
        if self.sasl_plain_users:
            props.update(self._sasl_properties())
        return "".join(f"{k}={v}\n" for k, v in props.items())

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
        argv = self._java_argv(java, "kafka.tools.StorageTool", "format", "--standalone",
                               "-t", kafka_cluster_id(), "-c", str(self.properties_file))
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


@dataclass
class RedisNode:
    """One ``redis-server`` with append-only persistence in ``data_dir``."""

    data_dir: Path
    port: int = DEFAULT_REDIS_PORT
    password: str | None = None
    path: str | None = None  # PATH used to look for redis-server (None: the process's own)
    name: str = "redis"

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()  # the server runs with cwd=data_dir

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """A redis:// URL (with the password when there is one)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def daemon(self) -> Daemon:
        """The server's process."""
        return Daemon("Redis", self.data_dir / "redis.pid", self.data_dir / "redis.out",
                      "redis-server")

    def running(self) -> bool:
        """True when the server's process runs."""
        return self.daemon.pid() is not None

    def healthy(self) -> bool:
        """True when the server answers PING."""
        return port_answers(self.port) and redis_answers(self.url)

    def start(self) -> bool:
        """Start the server and wait for PING; False when it already runs."""
        if self.running():
            _wait_ready("Redis", self.healthy, self.daemon, REDIS_READY_S)
            return False
        server = require_binary("redis-server", self.path)
        ensure_ports_free({"Redis": self.port})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "redis.conf"
        conf.write_text(self._conf())
        conf.chmod(0o600)
        self.daemon.start([server, str(conf)], cwd=self.data_dir)
        _wait_ready("Redis", self.healthy, self.daemon, REDIS_READY_S)
        return True

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """SIGTERM (Redis syncs its append-only file), wait, SIGKILL last; data is kept."""
        return self.daemon.stop(timeout_s)

    def kill(self) -> bool:
        """SIGKILL the server (a crash)."""
        return self.daemon.kill()

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start()

    def _conf(self) -> str:
        lines = [f"port {self.port}", f"bind {HOST}", f"dir {self.data_dir}",
                 "appendonly yes", "appendfsync everysec", "daemonize no",
                 "protected-mode yes", 'save ""', "loglevel warning"]
        if self.password:
            lines.append(f'requirepass "{self.password}"')
        return "\n".join(lines) + "\n"


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when the Redis at ``url`` answers PING."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                  socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


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
    """Kafka and Redis for development, in one data folder."""

    data_dir: Path = Path(".asynctier")
    kafka_port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    path: str | None = None  # PATH to look for java, mvn, redis-server (None: $PATH)

    @classmethod
    def resolve(cls, data_dir: Path, kafka_port: int | None = None,
                controller_port: int | None = None,
                redis_port: int | None = None) -> DevStack:
        """A stack whose unset ports come from the last ``up`` in ``data_dir``, then the
        defaults."""
        saved = _load_state(data_dir)
        return cls(
            data_dir=data_dir,
            kafka_port=kafka_port or saved.get("kafka_port", DEFAULT_KAFKA_PORT),
            controller_port=controller_port
            or saved.get("controller_port", DEFAULT_CONTROLLER_PORT),
            redis_port=redis_port or saved.get("redis_port", DEFAULT_REDIS_PORT),
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

    def services(self) -> tuple[Service, ...]:
        """Kafka and Redis."""
        return (self.kafka, self.redis)

    def up(self) -> list[ServiceStatus]:
        """Start both (those not running yet) and return once both answer."""
        self._check_binaries()
        result = []
        for service in self.services():
            started = service.start()
            self._save_state()
            result.append(ServiceStatus(service.name, service.address, True, True, started))
        return result

    def down(self, timeout_s: float = STOP_S) -> list[tuple[str, bool]]:
        """Stop both; returns (name, was it running) for each."""
        return [(s.name, s.stop(timeout_s)) for s in reversed(self.services())]

    def status(self) -> list[ServiceStatus]:
        """Whether each runs and answers."""
        return [ServiceStatus(s.name, s.address, s.running(), s.healthy())
                for s in self.services()]

    def reset(self) -> None:
        """Stop both and wipe the data folder."""
        self.down()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def env_lines(self) -> list[str]:
        """Shell lines that point asynctier (and its tests) at this stack."""
        return [f"export ASYNCTIER_KAFKA_BOOTSTRAP={self.kafka.bootstrap}",
                f"export ASYNCTIER_REDIS_URL={self.redis.url}"]

    def _check_binaries(self) -> None:
        """Every missing binary at once, before anything starts."""
        needed = ["java", "redis-server"]
        if not self.kafka.jars.is_fetched():
            needed.append("mvn")
        missing = [n for n in needed if shutil.which(n, path=self.path) is None]
        if missing:
            commands = "; ".join(f"{n}: `{INSTALL_COMMANDS[n]}`" for n in missing)
            raise ServiceError(
                f"missing {', '.join(missing)} on PATH. Install with (as root) {commands}; "
                f"or run scripts/setup.sh"
            )

    def _save_state(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = {"kafka_port": self.kafka_port, "controller_port": self.controller_port,
                 "redis_port": self.redis_port}
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


# --------------------------------------------------------------------------- test harness


def start_test_kafka(root: Path, cache_dir: Path | None = None,
                     sasl_plain_users: dict[str, str] | None = None) -> KafkaNode:
    """A Kafka node on free loopback ports with its data under ``root``, started
    (with a SASL/PLAIN listener when ``sasl_plain_users`` maps users to passwords)."""
    jars = KafkaJars(cache_dir=cache_dir or default_cache_dir())
    for attempt in range(3):
        node = KafkaNode(root / "kafka", free_port(), free_port(), jars=jars,
                         sasl_plain_users=sasl_plain_users)
        try:
            node.start()
            return node
        except ServiceError as exc:
            node.stop(5.0)
            if "already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def start_test_redis(root: Path, password: str | None = None) -> RedisNode:
    """A Redis server on a free loopback port with its data under ``root``, started."""
    for attempt in range(3):
        node = RedisNode(root / "redis", free_port(), password)
        try:
            node.start()
            return node
        except ServiceError as exc:
            node.stop(5.0)
            if "already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def random_password() -> str:
    """A password for a test Redis."""
    return secrets.token_urlsafe(18)


def _main(argv: Sequence[str]) -> int:
    """``python -m asynctier.platform.devstack fetch``: prefetch Kafka's jars."""
    if list(argv) != ["fetch"]:
        print("usage: python -m asynctier.platform.devstack fetch", file=sys.stderr)
        return 2
    try:
        libs = KafkaJars().ensure()
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Kafka jars ready in {libs}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
