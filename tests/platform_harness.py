"""Runs the platform's real processes (``python -m asynctier run ...``) for a test.

Each process gets the test's settings through the environment, logs to a file in the
test's folder, and is stopped (or killed) when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asynctier.dev.process import free_port
from asynctier.platform.config import Settings
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent


class Platform:
    """The processes of one test's platform."""

    def __init__(self, settings: Settings, folder: Path, allow: Sequence[str] = ("tests",),
                 env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.folder = folder
        self.allow = list(allow)
        self.group_protocol = "classic"
        self.ledger = folder / "ledger.txt"
        self.scheduler_ports: list[int] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.extra_env = env or {}

    def config_file(self) -> Path:
        """The platform's asynctier.toml: the test's Kafka, and the shortest session the
        broker allows (6 s), so a SIGKILLed tailer's partitions move on in seconds. With
        ``group_protocol = "consumer"`` (KIP-848) the session is the broker's (6 s in the
        dev stack) and the config only names the protocol."""
        path = self.folder / "asynctier.toml"
        if not path.exists():
            session = ('"group.protocol" = "consumer"\n' if self.group_protocol == "consumer"
                       else '"session.timeout.ms" = "6000"\n"heartbeat.interval.ms" = "1000"\n')
            path.write_text("[kafka]\n"
                            f'"bootstrap.servers" = "{self.settings.kafka_bootstrap}"\n'
                            + session)
        return path

    def env(self) -> dict[str, str]:
        """The environment every process of this platform gets."""
        env = dict(os.environ)
        env["ASYNCTIER_CONFIG"] = str(self.config_file())
        env.update({
            "ASYNCTIER_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
            "ASYNCTIER_REDIS_URL": self.settings.redis_url,
            "ASYNCTIER_PREFIX": self.settings.prefix,
            "ASYNCTIER_ALLOW_MODULES": ",".join(self.allow),
            "ASYNCTIER_TEST_LEDGER": str(self.ledger),
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        })
        if self.scheduler_ports:
            env["ASYNCTIER_SCHEDULERS"] = ",".join(f"127.0.0.1:{p}"
                                                   for p in self.scheduler_ports)
        env.update(self.extra_env)
        return env

    def cli(self, *args: str, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one ``asynctier`` command with this platform's settings."""
        done = subprocess.run([sys.executable, "-m", "asynctier", *args], env=self.env(),
                              input=input, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"asynctier {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def start(self, component: str, name: str | None = None, *args: str) -> str:
        """Start ``asynctier run COMPONENT``; returns the name to kill or stop it by."""
        name = name or component
        cmd = [sys.executable, "-m", "asynctier", "run", component, *args]
        if component == "scheduler":
            port = free_port()
            self.scheduler_ports.append(port)
            cmd += ["--listen", f"127.0.0.1:{port}"]
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=log,
                                            cwd=REPO)
        if component == "scheduler":
            self._wait_port(self.scheduler_ports[-1], name)
        return name

    def _wait_port(self, port: int, name: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited early:\n{self.log(name)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{name} did not listen on {port}:\n{self.log(name)}")

    def log(self, name: str, chars: int = 4000) -> str:
        """The tail of a process's log."""
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to a process."""
        self.procs[name].send_signal(sig)

    def kill(self, name: str) -> None:
        """SIGKILL a process and reap it."""
        self.procs[name].kill()
        self.procs[name].wait()

    def stop(self, name: str, timeout_s: float = 60.0) -> int:
        """SIGTERM a process and wait for it; returns its exit code."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._dump_stacks(name)
                proc.kill()
                proc.wait()
                raise AssertionError(f"{name} did not stop on SIGTERM (its threads' stacks "
                                     f"at the end):\n{self.log(name, 16000)}") from None
        return proc.returncode

    def _dump_stacks(self, name: str, timeout_s: float = 5.0) -> None:
        """Ask a stuck ``asynctier run`` process for every thread's stack (SIGUSR1, written
        to its log) and wait until the log has it, so the failure says where it hung."""
        path = self.folder / f"{name}.log"
        before = path.stat().st_size if path.exists() else 0
        self.procs[name].send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > before and \
                    "most recent call first" in path.read_text(errors="replace")[before:]:
                return
            time.sleep(0.1)

    def alive(self, name: str) -> bool:
        """True while the process runs."""
        return self.procs[name].poll() is None

    def stop_all(self) -> None:
        """Stop tailers first, then the rest; kill what does not stop."""
        order = sorted(self.procs, key=lambda n: n.startswith("scheduler"))
        for name in order:
            with contextlib.suppress(AssertionError):
                self.stop(name, 30.0)


def produce_json(settings: Settings, topic: str, docs: Sequence[dict[str, object]],
                 key_of: str | None = None) -> None:
    """Produce JSON records and wait until every one is confirmed, each partition's in
    the order given (tests read a key's order from it)."""
    import json

    from confluent_kafka import Producer

    # Idempotent: a produce request retried (a partition of a topic just made is not
    # ready on its broker yet) is written in its place, not after the requests sent
    # behind it; a plain producer reorders a partition's batches then.
    producer = Producer(settings.kafka_config(**{"linger.ms": 20,  # TLS/SASL as set
                                                 "enable.idempotence": True}))
    failures: list[str] = []

    def report(err: object, msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for doc in docs:
        key = str(doc[key_of]).encode() if key_of else None
        while True:
            try:
                producer.produce(topic, json.dumps(doc).encode(), key, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0 and not failures, failures[:3]


def produce_raw(settings: Settings, topic: str,
                records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
    """Produce (key, value) records as they are, and wait until each is confirmed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "message.max.bytes": 8 * 1024 * 1024})
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(60) == 0


def read_topic(settings: Settings, topic: str, timeout_s: float = 10.0) -> list[object]:
    """Every record of ``topic`` (all partitions), from the beginning to the current end."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_config(**{  # the [kafka] table: TLS, SASL
        "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
    meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=timeout_s)[1]
            for tp in parts}
    consumer.assign([TopicPartition(topic, p, -2) for p in meta.partitions])
    out: list[object] = []
    deadline = time.monotonic() + timeout_s
    remaining = {p for p, end in ends.items() if end > 0}
    while remaining and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            if msg.error():
                continue
            out.append(msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                remaining.discard(msg.partition())
    consumer.close()
    return out


def committed_vs_end(settings: Settings, group: str, topic: str) -> tuple[int, int]:
    """(sum of committed offsets, sum of end offsets) of ``group`` on ``topic``. A group
    coordinator still loading (a broker just started) is asked again for up to 30 s."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    parts = [TopicPartition(topic, p) for p in meta.partitions]
    busy = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
            KafkaError.COORDINATOR_NOT_AVAILABLE)

    def answered() -> list[Any] | None:
        try:
            return list(consumer.committed(parts, timeout=10))
        except KafkaException as exc:
            if exc.args[0].code() not in busy:
                raise
            return None

    committed = wait_until(answered, 30, f"the committed offsets of group {group}")
    end = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
    consumer.close()
    return sum(max(tp.offset, 0) for tp in committed), end


def cli_in_process(platform: Platform, *args: str) -> str:
    """``asynctier ARGS`` with the platform's settings, run in this process (a subprocess
    costs seconds of interpreter start); its output. Fails the test when it fails."""
    from click.testing import CliRunner

    from asynctier.cli import main

    env = {k: v for k, v in platform.env().items() if k.startswith("ASYNCTIER_")}
    done = CliRunner().invoke(main, list(args), env=env)
    assert done.exit_code == 0, f"asynctier {' '.join(args)}: {done.output}"
    return done.output
