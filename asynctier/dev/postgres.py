"""One PostgreSQL server (Debian's ``postgresql``) with its cluster in a folder.

The first start runs ``initdb``; every start runs ``postgres`` on loopback only, with a
database ``asynctier`` and a superuser ``asynctier`` (trust on loopback, or a password).
PostgreSQL refuses to run as root: when the caller is root, initdb and the server run as
the unprivileged ``postgres`` user (from the Debian package), else ``nobody``, with the
cluster's folder owned by that user.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.process import (
    DEFAULT_POSTGRES_PORT,
    HOST,
    INSTALL_COMMANDS,
    POSTGRES_READY_S,
    Daemon,
    DaemonNode,
    ensure_ports_free,
    port_answers,
)
from asynctier.platform.errors import ServiceError

#: Where Debian installs each major version's server binaries.
DEBIAN_LIB = Path("/usr/lib/postgresql")
MIN_VERSION = 15
DATABASE = "asynctier"
SUPERUSER = "asynctier"
#: Server settings of the local stack: autovacuum looks every second (a queue table
#: churns; see asynctier/queue), and the log is terse.
DEV_SETTINGS: Mapping[str, str] = {
    "autovacuum_naptime": "1s",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
}
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes, the socket's name takes ~17


@dataclass
class PostgresNode(DaemonNode):
    """One ``postgres`` server whose cluster, log and pid file live in ``data_dir``."""

    data_dir: Path
    port: int = DEFAULT_POSTGRES_PORT
    password: str | None = None
    path: str | None = None  # PATH to look on (None: Debian's folders, then $PATH)
    settings: Mapping[str, str] = field(default_factory=lambda: dict(DEV_SETTINGS))
    name: str = "postgres"

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()

    @property
    def cluster_dir(self) -> Path:
        """The folder initdb made (owned by the server's user)."""
        return self.data_dir / "pgdata"

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{HOST}:{self.port}"

    @property
    def dsn(self) -> str:
        """A postgresql:// URL of the ``asynctier`` database (with the password, if any)."""
        return self._dsn(DATABASE)

    def _dsn(self, database: str) -> str:
        auth = f"{SUPERUSER}:{self.password}" if self.password else SUPERUSER
        return f"postgresql://{auth}@{HOST}:{self.port}/{database}"

    @property
    def daemon(self) -> Daemon:
        """The server's process (stopped by SIGINT: a fast shutdown)."""
        return Daemon("PostgreSQL", self.data_dir / "postgres.pid",
                      self.data_dir / "postgres.out", "postgres", signal.SIGINT)

    def running(self) -> bool:
        """True when the server's process runs."""
        return self.daemon.pid() is not None

    def healthy(self) -> bool:
        """True when the server accepts a connection and answers a query."""
        return port_answers(self.port) and postgres_answers(self._dsn("postgres"))

    def start(self) -> bool:
        """initdb when needed, start the server and wait for it; False when it already
        runs."""
        from asynctier.dev.process import wait_ready

        if self.running():
            wait_ready("PostgreSQL", self.healthy, self.daemon, POSTGRES_READY_S)
            return False
        bin_dir = find_bin_dir(self.path)
        ensure_ports_free({"PostgreSQL": self.port})
        user = server_user()
        self._prepare(user)
        if not (self.cluster_dir / "PG_VERSION").is_file():
            self._initdb(bin_dir, user)
        self.daemon.start(self._argv(bin_dir), cwd=self.data_dir, user=user)
        wait_ready("PostgreSQL", self.healthy, self.daemon, POSTGRES_READY_S)
        self._create_database()
        return True




    def _argv(self, bin_dir: Path) -> list[str]:
        argv = [str(bin_dir / "postgres"), "-D", str(self.cluster_dir), "-p", str(self.port),
                "-c", f"listen_addresses={HOST}",
                "-c", f"unix_socket_directories={self._socket_dir()}"]
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _socket_dir(self) -> str:
        """The socket folder, or '' (TCP only) when its path would be too long."""
        sock = self.data_dir / "sock"
        return str(sock) if len(str(sock)) <= _SOCKET_PATH_MAX else ""

    def _prepare(self, user: str | None) -> None:
        """Make the folders; as root, give the cluster's to the server's user."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for folder in (self.cluster_dir, self.data_dir / "sock"):
            folder.mkdir(mode=0o700, exist_ok=True)
            if user is not None:
                shutil.chown(folder, user, _group_of(user))
        if user is not None:
            check_reachable(self.cluster_dir, user)

    def _initdb(self, bin_dir: Path, user: str | None) -> None:
        argv = [str(bin_dir / "initdb"), "-D", str(self.cluster_dir), "-U", SUPERUSER,
                "-E", "UTF8", "--no-locale", "--no-instructions"]
        pwfile = self.data_dir / "initdb.pw"
        if self.password:
            pwfile.write_text(self.password + "\n")
            pwfile.chmod(0o600)
            if user is not None:
                shutil.chown(pwfile, user, _group_of(user))
            argv += ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        else:
            argv += ["-A", "trust"]
        try:
            done = subprocess.run(argv, cwd=self.data_dir, capture_output=True, text=True,
                                  timeout=120, check=False, user=user,
                                  group=None if user is None else _group_of(user),
                                  extra_groups=None if user is None else [])
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            shutil.rmtree(self.cluster_dir, ignore_errors=True)
            raise ServiceError(f"initdb of {self.cluster_dir} failed "
                               f"(exit {done.returncode}):\n{done.stdout}{done.stderr}")

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (DATABASE,)).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')


def postgres_answers(dsn: str, timeout_s: float = 2.0) -> bool:
    """True when the server at ``dsn`` accepts a connection and answers ``SELECT 1``."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=max(1, int(timeout_s))) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def find_bin_dir(path: str | None = None) -> Path:
    """The folder of the newest ``postgres`` and ``initdb`` (15 or newer): Debian's
    /usr/lib/postgresql/<version>/bin, else ``$PATH`` (or ``path`` alone when given)."""
    if path is None:
        versions = sorted((int(p.name), p / "bin") for p in _debian_versions())
        for version, bin_dir in reversed(versions):
            if version >= MIN_VERSION and (bin_dir / "initdb").is_file():
                return bin_dir
    found = shutil.which("postgres", path=path)
    if found is not None and shutil.which("initdb", path=str(Path(found).parent)):
        return Path(found).parent
    raise ServiceError(
        f"PostgreSQL {MIN_VERSION}+ is not installed (no postgres and initdb in "
        f"{DEBIAN_LIB}/<version>/bin or on PATH): install it with "
        f"`{INSTALL_COMMANDS['postgres']}` (as root), or run scripts/setup.sh"
    )


def _debian_versions() -> list[Path]:
    if not DEBIAN_LIB.is_dir():
        return []
    return [p for p in DEBIAN_LIB.iterdir() if re.fullmatch(r"\d+", p.name)]


def server_user() -> str | None:
    """The user the server runs as: None (ourselves) unless we are root, then
    ``postgres`` when it exists, else ``nobody``."""
    if os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise ServiceError("running as root, and neither a `postgres` nor a `nobody` user exists "
                       "to run PostgreSQL as: create one (`apt-get install -y postgresql` "
                       "makes `postgres`)")


def _group_of(user: str) -> int:
    import pwd

    return int(pwd.getpwnam(user).pw_gid)


def check_reachable(folder: Path, user: str) -> None:
    """Raise a ServiceError naming the first parent of ``folder`` that ``user`` cannot
    enter (the server could not reach its data)."""
    import pwd

    entry = pwd.getpwnam(user)
    for parent in reversed(folder.parents):
        info = parent.stat()
        if info.st_uid == entry.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == entry.pw_gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            raise ServiceError(
                f"PostgreSQL runs as the user {user!r} (it refuses root), who cannot enter "
                f"{parent} (mode {stat.filemode(info.st_mode)}): keep the data elsewhere "
                f"(--data-dir) or allow it with `chmod o+x {parent}`")
