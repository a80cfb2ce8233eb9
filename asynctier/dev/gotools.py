"""The Go tools the tests use, built once from the Go module proxy and cached under
``~/.cache/asynctier/go-tools/``:

* ``helm`` (:data:`HELM`): ``helm lint`` and ``helm template`` of ``deploy/helm/asynctier``;
* ``kubecheck`` (:data:`KUBECHECK`, ``deploy/helm/kubecheck``): the rendered manifests
  against Kubernetes' API types (client-go's strict decoding and apply schema);
* ``jaeger`` (:data:`JAEGER`, ``deploy/jaeger``): the traces' backend in the tests and
  ``asynctier dev up --with tracing`` (:mod:`asynctier.dev.jaeger`).

A tool's folder is named for its version (helm) or the hash of its sources (kubecheck), so
a second set-up finds it at once and a changed version builds anew.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.process import FETCH_S, default_cache_dir, file_lock
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

#: The repository's root (``deploy/helm/kubecheck`` is there).
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GoTool:
    """One Go command: ``package@version`` from the proxy, or a module folder of ours
    (``source``, built with ``go build``)."""

    name: str
    package: str = ""
    version: str = ""
    source: Path | None = None
    #: What ``go build`` builds in ``source``: the folder's own package, or a ``tool`` its
    #: go.mod pins (a program whose go.mod has replace directives: ``go install`` refuses).
    target: str = "."
    cache_dir: Path = field(default_factory=default_cache_dir)

    @property
    def key(self) -> str:
        """The version, or a hash of the module folder's go.mod, go.sum and Go files."""
        if self.source is None:
            return self.version
        digest = hashlib.sha256()
        for path in sorted([*self.source.glob("*.go"), *self.source.glob("go.*")]):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:16]

    @property
    def path(self) -> Path:
        """``<cache>/go-tools/<name>-<key>/<name>``."""
        return self.cache_dir / "go-tools" / f"{self.name}-{self.key}" / self.name

    def ensure(self) -> Path:
        """Build the tool when it is not cached yet; its path."""
        if self.path.is_file():
            return self.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path.parent / ".lock"):
            if not self.path.is_file():
                self._build()
        return self.path

    def _build(self) -> None:
        go = shutil.which("go")
        if go is None:
            raise ServiceError(f"{self.name} is built with Go, which is not installed: install "
                               "Go 1.25 or later (`apt-get install -y golang-go` where Debian "
                               "has it that recent), then run scripts/setup.sh again")
        staging = Path(tempfile.mkdtemp(prefix="build-", dir=self.path.parent))
        env = {**os.environ, "GOBIN": str(staging), "GOFLAGS": "-buildvcs=false",
               "CGO_ENABLED": "0"}
        if self.source is None:
            argv, cwd = [go, "install", f"{self.package}@{self.version}"], None
        else:
            argv, cwd = [go, "build", "-o", str(staging / self.name), self.target], self.source
        log.info("building %s with Go (%s): a few minutes, once", self.name, " ".join(argv))
        try:
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=FETCH_S, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ServiceError(f"Go did not build {self.name} within {FETCH_S:.0f} s") from exc
        built = staging / self.name
        if done.returncode != 0 or not built.is_file():
            shutil.rmtree(staging, ignore_errors=True)
            output = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise ServiceError(f"Go could not build {self.name} ({' '.join(argv)}):\n{output}")
        built.rename(self.path)
        shutil.rmtree(staging, ignore_errors=True)


HELM = GoTool("helm", package="helm.sh/helm/v4/cmd/helm", version="v4.3.2")
KUBECHECK = GoTool("kubecheck", source=ROOT / "deploy" / "helm" / "kubecheck")
JAEGER = GoTool("jaeger", source=ROOT / "deploy" / "jaeger",
                target="github.com/jaegertracing/jaeger/cmd/jaeger")

