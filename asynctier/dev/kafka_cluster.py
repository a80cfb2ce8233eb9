"""A Kafka cluster on loopback for tests: ``brokers`` KRaft nodes (each broker and
controller, one static quorum) from the same jars as :class:`~.kafka.KafkaNode`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.dev.kafka import KafkaJars, KafkaNode, kafka_answers, kafka_cluster_id
from asynctier.dev.process import HOST, STOP_S, free_port


@dataclass
class KafkaCluster:
    """``brokers`` Kafka nodes with their data under ``root``; the broker's internal
    topics (offsets, transactions) replicated ``min(3, brokers)`` times. The broker's
    ``default.replication.factor`` stays 1: the platform sets its topics' own."""

    root: Path
    brokers: int = 3
    jars: KafkaJars = field(default_factory=KafkaJars)
    heap: str = "512m"
    nodes: list[KafkaNode] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        """Every broker's address, comma-separated."""
        return ",".join(n.bootstrap for n in self.nodes)

    def start(self) -> bool:
        """Start every node (formatting them once) and wait until each answers."""
        if not self.nodes:
            self.nodes = self._make()
        for node in self.nodes:
            if not node.running():
                node.prepare()
        started = [node.launch() for node in self.nodes]
        for node in self.nodes:
            node.wait()
        return any(started)

    def stop(self, timeout_s: float = STOP_S) -> bool:
        """Stop every node at once (data kept): one by one, the last could not shut down
        in a controlled way without a quorum and would wait ``timeout_s`` for nothing."""
        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as pool:
            stopped = list(pool.map(lambda node: node.stop(timeout_s), self.nodes))
        return any(stopped)

    def healthy(self) -> bool:
        """True when the cluster answers with all its brokers."""
        from confluent_kafka.admin import AdminClient

        if not kafka_answers(self.bootstrap):
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            return len(admin.list_topics(timeout=5).brokers) == len(self.nodes)
        except Exception:  # KafkaException and friends: not yet
            return False

    def _make(self) -> list[KafkaNode]:
        ports = [(free_port(), free_port()) for _ in range(self.brokers)]
        voters = ",".join(f"{i + 1}@{HOST}:{c}" for i, (_, c) in enumerate(ports))
        cluster_id = kafka_cluster_id()
        return [KafkaNode(self.root / f"kafka-{i + 1}", port, controller, jars=self.jars,
                          heap=self.heap, name=f"kafka-{i + 1}", node_id=i + 1,
                          voters=voters, cluster_id=cluster_id,
                          internal_replication=min(3, self.brokers))
                for i, (port, controller) in enumerate(ports)]
