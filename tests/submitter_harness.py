"""The platform's processes with Submitters, for the Submitter's end-to-end tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from asynctier.client import Client
from asynctier.platform.config import Settings
from tests.faults.harness import FUNCTION, FaultPlatform
from tests.platform_harness import free_port


class SubmitterPlatform(FaultPlatform):
    """A test's platform (scheduler, tailers, Submitters) on one PostgreSQL shard."""

    def __init__(self, settings: Settings, folder: Path, shards: Sequence[str]) -> None:
        super().__init__(settings, folder, env={"ASYNCTIER_QUEUE_SHARDS": ",".join(shards)})
        self.submitter_ports: dict[str, int] = {}

    def bind_queue(self, name: str, topic: str, namespace: str, *extra: str) -> None:
        """``asynctier bind NAME --queue TOPIC --tenant NAMESPACE ...``."""
        self.cli("bind", name, "--queue", topic, "--tenant", namespace, "--function",
                 FUNCTION, *extra)

    def start_submitter(self, name: str = "submitter", *args: str) -> str:
        """``asynctier run submitter`` on a free port; waits until it listens."""
        port = free_port()
        self.submitter_ports[name] = port
        self.extra_env["ASYNCTIER_SUBMITTERS"] = self.submitter_list()
        self.start("submitter", name, "--submitter-listen", f"127.0.0.1:{port}", *args)
        self._wait_port(port, name)
        return name

    def submitter_list(self) -> str:
        """Every Submitter started, as ASYNCTIER_SUBMITTERS takes them."""
        return ",".join(f"127.0.0.1:{p}" for p in self.submitter_ports.values())

    def client(self, **options: object) -> Client:
        """A Client of every Submitter started."""
        return Client([f"127.0.0.1:{p}" for p in self.submitter_ports.values()],
                      **options)  # type: ignore[arg-type]
