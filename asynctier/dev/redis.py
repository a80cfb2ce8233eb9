"""One Redis server (Debian's ``redis-server``) with its data in a folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from asynctier.dev.process import (
    DEFAULT_REDIS_PORT,
    HOST,
    REDIS_READY_S,
    Daemon,
    DaemonNode,
    TlsFiles,
    ensure_ports_free,
    port_answers,
    require_binary,
    wait_ready,
)

log = logging.getLogger(__name__)




@dataclass
class RedisNode(DaemonNode):
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
    #: PEM files: the port speaks TLS only (client certificates optional).
    tls: TlsFiles | None = None
    #: ACL users (name -> password) with every right; the default user is then off.
    acl_users: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()  # the server runs with cwd=data_dir

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """A redis:// URL (with the password when there is one), rediss:// with the CA
        with TLS, as the first ACL user when there are some."""
        return self.url_of(next(iter(self.acl_users)) if self.acl_users else None)

    def url_of(self, user: str | None, password: str | None = None) -> str:
        """The URL of ``user`` (an ACL user; None: the default user) with its password, or
        ``password`` instead."""
        secret = password or (self.acl_users or {}).get(user or "") or self.password
        auth = f"{user or ''}:{secret}@" if secret else ""
        if self.tls is None:
            return f"redis://{auth}{HOST}:{self.port}/0"
        return f"rediss://{auth}{HOST}:{self.port}/0?ssl_ca_certs={self.tls.ca}"

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
        if self.tls is not None:
            lines[0] = "port 0"
            lines += [f"tls-port {self.port}", f"tls-cert-file {self.tls.cert}",
                      f"tls-key-file {self.tls.key}", f"tls-ca-cert-file {self.tls.ca}",
                      "tls-auth-clients optional"]
        for user, secret in (self.acl_users or {}).items():
            lines.append(f"user {user} on >{secret} ~* &* +@all")
        if self.acl_users:
            lines.append("user default off")
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
