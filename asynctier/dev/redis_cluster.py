"""A Redis Cluster on loopback for tests: 3 masters, each with 0 or 1 replica, made with
``redis-server --cluster-enabled yes`` and ``redis-cli --cluster create``."""

from __future__ import annotations

import logging
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asynctier.dev.process import HOST, STOP_S, free_port, require_binary
from asynctier.dev.redis import RedisNode
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)

#: How long the cluster may take to agree on its slots (or on a failover).
CLUSTER_READY_S = 30.0


@dataclass
class RedisClusterNodes:
    """``masters`` masters (and ``replicas`` replicas each) with data under ``root``."""

    root: Path
    masters: int = 3
    replicas: int = 0
    nodes: list[RedisNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The platform's cluster URL: ``redis+cluster://host:port,host:port,...``."""
        return "redis+cluster://" + ",".join(n.address for n in self.nodes)

    def start(self) -> bool:
        """Start every node, create the cluster once and wait until its state is ok."""
        if not self.nodes:
            total = self.masters * (1 + self.replicas)
            self.nodes = [RedisNode(self.root / f"redis-{i}", free_port(), cluster=True,
                                    name=f"redis-{i}", bus_port=free_port()) for i in range(total)]
        for node in self.nodes:
            node.start()
        if not self._slots_assigned(self.nodes[0]):
            self._create()
        self.wait_ok()
        return True

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """Stop every node at once (data kept)."""
        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as pool:
            stopped = list(pool.map(lambda node: node.stop(timeout_s), self.nodes))
        return any(stopped)

    def node_at(self, port: int) -> RedisNode:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def master_of(self, key: str) -> RedisNode:
        """The node that serves ``key``'s slot now."""
        import redis

        for node in self.live():
            try:
                slot = int(_command(node, "CLUSTER", "KEYSLOT", key))
                for start, end, master, *_ in _command(node, "CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return self.node_at(int(master[1]))
            except redis.RedisError:
                continue
        raise ServiceError(f"no live node of the Redis Cluster knows who serves {key!r}")

    def live(self) -> list[RedisNode]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.running()]

    def wait_ok(self, timeout_s: float = CLUSTER_READY_S) -> None:
        """Wait until every live node says ``cluster_state:ok`` with every slot served by
        a live master (after a kill: once a replica took over), and every live replica
        has its master's data (a replica that takes over before it synced has none)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (all(self._state_ok(n) for n in self.live()) and self._masters_live()
                    and all(self._synced(n) for n in self.live())):
                return
            time.sleep(0.1)
        raise ServiceError(f"the Redis Cluster under {self.root} was not ok within "
                           f"{timeout_s:.0f} s (see each node's redis.out)")

    def wait_replicated(self, key: str, timeout_s: float = CLUSTER_READY_S) -> None:
        """Wait until every replica of ``key``'s master has everything that master had
        written when called (its replication offset): a replica that takes over after a
        kill then has the same data. Replication is asynchronous, and on a busy machine a
        replica can lag for longer than any fixed pause."""
        import redis

        master = self.master_of(key)
        target = int(_command(master, "INFO", "replication")["master_repl_offset"])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                info = _command(master, "INFO", "replication")
            except redis.RedisError:
                info = {}
            replicas = [_fields(v) for k, v in info.items()
                        if k.startswith("slave") and k[5:].isdigit()]
            if replicas and all(r.get("state") == "online" and int(r.get("offset", -1)) >= target
                                for r in replicas):
                return
            time.sleep(0.05)
        raise ServiceError(f"the replicas of the Redis Cluster node on port {master.port} did "
                           f"not reach its replication offset {target} within {timeout_s:.0f} s")

    def _masters_live(self) -> bool:
        import redis

        live_ports = {n.port for n in self.live()}
        try:
            slots = _command(self.live()[0], "CLUSTER", "SLOTS")
        except redis.RedisError:
            return False
        covered: int = sum(end - start + 1 for start, end, master, *_ in slots
                      if int(master[1]) in live_ports)
        return covered == 16384

    def _create(self) -> None:
        cli = require_binary("redis-cli")
        argv = [cli, "--cluster", "create", *(n.address for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ServiceError(f"redis-cli could not create the cluster ({' '.join(argv)}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    @staticmethod
    def _info(node: RedisNode) -> str:
        import redis

        try:
            return str(_command(node, "CLUSTER", "INFO"), "utf-8", "replace")
        except redis.RedisError:
            return ""

    def _state_ok(self, node: RedisNode) -> bool:
        return "cluster_state:ok" in self._info(node)

    @staticmethod
    def _synced(node: RedisNode) -> bool:
        import redis

        try:
            info = _command(node, "INFO", "replication")  # parsed by redis-py: a dict
        except redis.RedisError:
            return False
        return bool(info.get("role") != "slave" or info.get("master_link_status") == "up")

    def _slots_assigned(self, node: RedisNode) -> bool:
        return "cluster_slots_assigned:16384" in self._info(node)


def _fields(value: Any) -> dict[str, Any]:
    """A replica's line of ``INFO replication`` (``ip=..,port=..,state=..,offset=..``) as a
    dict, whether redis-py parsed it already or not."""
    if isinstance(value, dict):
        return value
    return dict(part.split("=", 1) for part in str(value).split(",") if "=" in part)


def _command(node: RedisNode, *args: str) -> Any:
    """One command's raw reply from ``node``."""
    import redis

    client = redis.Redis(host=HOST, port=node.port, socket_timeout=2.0)
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()
