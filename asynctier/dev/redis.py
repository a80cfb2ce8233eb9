"""One Redis server (Debian's ``redis-server``) with its data in a folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from asynctier.dev.process import (
    DEFAULT_REDIS_PORT,
    HOST,
    REDIS_READY_S,
    STOP_S,
    Daemon,
    ensure_ports_free,
    port_answers,
    require_binary,
    wait_ready,
)

log = logging.getLogger(__name__)




@dataclass
class RedisNode:
    """One ``redis-server`` with append-only persistence in ``data_dir``."""

    data_dir: Path
    port: int = DEFAULT_REDIS_PORT
    password: str | None = None
    path: str | None = None  # PATH used to look for redis-server (None: the process's own)
    name: str = "redis"
    #: Run as one node of a Redis Cluster (``cluster-enabled yes``, see .redis_cluster).
    cluster: bool = False
    #: The cluster bus port (None: Redis' own choice, port + 10000).
    bus_port: int | None = None

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
            wait_ready("Redis", self.healthy, self.daemon, REDIS_READY_S)
            return False
        server = require_binary("redis-server", self.path)
        ensure_ports_free({"Redis": self.port})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "redis.conf"
        conf.write_text(self._conf())
        conf.chmod(0o600)
        self.daemon.start([server, str(conf)], cwd=self.data_dir)
        wait_ready("Redis", self.healthy, self.daemon, REDIS_READY_S)
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
        if self.cluster:  # a short node timeout: a killed master fails over in seconds
            lines += ["cluster-enabled yes", "cluster-config-file nodes.conf",
                      "cluster-node-timeout 2000", "cluster-replica-validity-factor 0"]
            if self.bus_port is not None:
                lines.append(f"cluster-port {self.bus_port}")
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
