"""One Jaeger (v2, ``cmd/jaeger`` of ``github.com/jaegertracing/jaeger``) for the traces'
tests and ``asynctier dev up --with tracing``: spans arrive over OTLP (gRPC) and are kept in
memory; its query API (``/api/traces/<id>``) reads them back.

The binary is built once by Go from the module proxy (``deploy/jaeger``: a module whose
only content is the pinned tool) and cached with the other Go tools.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asynctier.dev.gotools import JAEGER
from asynctier.dev.process import HOST, Daemon, DaemonNode, ensure_ports_free, wait_ready

log = logging.getLogger(__name__)

DEFAULT_OTLP_PORT = 4317
DEFAULT_QUERY_PORT = 16686
#: Its gRPC query API and health check (nothing here uses them, but they need ports).
DEFAULT_QUERY_GRPC_PORT = 16685
DEFAULT_HEALTH_PORT = 13133
READY_S = 60.0

_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: {host}:{query}
    grpc:
      endpoint: {host}:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: {host}:{health}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {host}:{otlp}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


@dataclass
class JaegerNode(DaemonNode):
    """One Jaeger on loopback: OTLP on ``otlp_port``, its query API on ``query_port``."""

    data_dir: Path
    otlp_port: int = DEFAULT_OTLP_PORT
    query_port: int = DEFAULT_QUERY_PORT
    query_grpc_port: int = DEFAULT_QUERY_GRPC_PORT
    health_port: int = DEFAULT_HEALTH_PORT
    name: str = "jaeger"

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.absolute()

    @property
    def address(self) -> str:
        """Where spans go: ``host:port`` of OTLP over gRPC."""
        return f"{HOST}:{self.otlp_port}"

    @property
    def endpoint(self) -> str:
        """The OTLP endpoint as ``[tracing] endpoint`` takes it."""
        return f"http://{HOST}:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        """The base URL of its query API (and UI)."""
        return f"http://{HOST}:{self.query_port}"

    @property
    def daemon(self) -> Daemon:
        """Jaeger's process."""
        return Daemon("Jaeger", self.data_dir / "jaeger.pid", self.data_dir / "jaeger.out",
                      "jaeger")

    def running(self) -> bool:
        """True when its process runs."""
        return self.daemon.pid() is not None

    def healthy(self) -> bool:
        """True when its query API lists services."""
        return self.services() is not None

    def start(self) -> bool:
        """Start Jaeger (built first when not cached) and wait until it answers; False
        when it already runs."""
        if self.running():
            wait_ready("Jaeger", self.healthy, self.daemon, READY_S)
            return False
        binary = JAEGER.ensure()
        ensure_ports_free({"jaeger otlp": self.otlp_port, "jaeger query": self.query_port,
                           "jaeger query grpc": self.query_grpc_port,
                           "jaeger health": self.health_port})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "jaeger.yaml"
        config.write_text(_CONFIG.format(host=HOST, otlp=self.otlp_port, query=self.query_port,
                                         query_grpc=self.query_grpc_port,
                                         health=self.health_port))
        self.daemon.start([str(binary), "--config", f"file:{config}"], cwd=self.data_dir)
        wait_ready("Jaeger", self.healthy, self.daemon, READY_S)
        return True

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"{self.query_url}{path}", timeout=5) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        except (OSError, ValueError):
            return None

    def services(self) -> list[str] | None:
        """The services that sent spans (None when it does not answer)."""
        doc = self._get("/api/services")
        return None if doc is None else list(doc.get("data") or [])

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace as the query API gives it (its ``spans`` and ``processes``), or None
        while it has none of its spans."""
        doc = self._get(f"/api/traces/{trace_id}")
        if not doc or not doc.get("data"):
            return None
        found: dict[str, Any] = doc["data"][0]
        return found
