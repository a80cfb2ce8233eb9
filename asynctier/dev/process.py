"""Small tools of the local stack: ports, binaries, detached processes found again by
their pid file."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
DEFAULT_REDIS_PORT = 6379
DEFAULT_POSTGRES_PORT = 5432
KAFKA_READY_S = 90.0
REDIS_READY_S = 20.0
POSTGRES_READY_S = 60.0
STOP_S = 30.0
FETCH_S = 900.0

#: The exact command that installs each binary the stack needs (Debian / Ubuntu).
INSTALL_COMMANDS = {
    "java": "apt-get install -y openjdk-17-jre-headless",
    "mvn": "apt-get install -y maven",
    "redis-server": "apt-get install -y redis-server",
    "postgres": "apt-get install -y postgresql",
    "initdb": "apt-get install -y postgresql",
}



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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made when missing): one fetch or build at once."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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


#: Ports handed to services: below Linux's default range of ephemeral ports (32768-60999),
#: from which the kernel picks the local port of every outgoing connection. A service
#: stopped and started again on its port (a fault test's broker) could otherwise find it
#: taken by some client's connection meanwhile.
SERVICE_PORTS = range(10_000, 32_768)


def free_port(host: str = HOST) -> int:
    """A TCP port that nothing listens on right now, outside the ephemeral range."""
    for _ in range(1000):
        port = random.choice(SERVICE_PORTS)
        if port_is_free(port, host):
            return port
    raise ServiceError(f"no free TCP port on {host} among {SERVICE_PORTS.start}-"
                       f"{SERVICE_PORTS.stop - 1} after 1,000 tries")


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True



@dataclass(frozen=True)
class TlsFiles:
    """A server's PEM files: the CA it trusts, its certificate and its key."""

    ca: Path
    cert: Path
    key: Path


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


def sha256_of(path: Path) -> str:
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
    #: The signal that stops it (PostgreSQL: SIGINT, a fast shutdown that does not wait
    #: for clients to disconnect).
    stop_signal: signal.Signals = signal.SIGTERM

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

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None,
              user: str | None = None) -> int:
        """Start ``argv`` detached, output appended to the log file; returns its pid.

        ``user``: run it as that user (its own group, no supplementary groups); for a
        server that refuses to run as root.
        """
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(env) if env is not None else None, user=user,
                group=None if user is None else _primary_group(user),
                extra_groups=None if user is None else [],
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """The stop signal (SIGTERM unless set), wait up to ``timeout_s``, SIGKILL last.

        Returns True when a process was stopped, False when none was running.
        """
        pid = self.pid()
        if pid is None:
            return False
        self._signal(pid, self.stop_signal)
        if not _wait_gone(pid, timeout_s):
            log.warning("%s (pid %d) ignored its stop signal for %.0f s: killing it",
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


def _primary_group(user: str) -> int:
    import pwd

    return int(pwd.getpwnam(user).pw_gid)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def wait_ready(what: str, ready: Callable[[], bool], daemon: Daemon, timeout_s: float,
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


# --------------------------------------------------------------------------- services


class DaemonNode:
    """A service run by one :class:`Daemon`, its data kept in a folder: stopping, killing
    and restarting it are the same for every kind (Kafka, Redis, PostgreSQL)."""

    @property
    def daemon(self) -> Daemon:
        """Its process (each kind says how it is found and signalled)."""
        raise NotImplementedError

    def start(self) -> bool:
        """Start it (no-op when up); True when it was started now."""
        raise NotImplementedError

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """Its own shutdown (SIGTERM: Redis syncs its append-only file, PostgreSQL shuts
        down fast), a SIGKILL after ``timeout_s``; the data is kept. True when it ran."""
        return self.daemon.stop(timeout_s)

    def kill(self) -> bool:
        """SIGKILL it (a crash); the data is kept and recovered at the next start."""
        return self.daemon.kill()

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data."""
        self.stop()
        self.start()


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
