"""The fault harness: the real processes (``tests.platform_harness.Platform``) plus what a
fault scenario needs: a ledger function, restarts on the same port, a supervisor that
restarts a dying process (as systemd or Kubernetes would), and the read-back of dead
letters and of records still waiting in delay topics.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from asynctier.platform.config import Settings
from asynctier.platform.durations import format_duration
from tests.faults import checker
from tests.faults.checker import Report
from tests.helpers import record_headers, wait_until
from tests.platform_harness import REPO, Platform, produce_json, read_topic

FUNCTION = "tests.faults.funcs:run"


class FaultPlatform(Platform):
    """A test's platform processes, with restarts and a scheduler supervisor."""

    def __init__(self, settings: Settings, folder: Path,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(settings, folder, allow=("tests.faults",), env=env)
        self.ports: dict[str, int] = {}
        self.restarts: dict[str, int] = {}
        self._commands: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {}
        self._supervised: dict[str, float] = {}  # name -> pause before a restart (s)
        self._dead_since: dict[str, float] = {}
        self._lock = threading.Lock()  # a kill and the supervisor's restart take turns
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    # -- processes ------------------------------------------------------------------------

    def bind(self, name: str, topic: str, *extra: str) -> None:
        """``asynctier bind NAME --topic T --function tests.faults.funcs:run ...``."""
        self.cli("bind", name, "--topic", topic, "--function", FUNCTION, *extra)

    def start(self, component: str, name: str | None = None, *args: str) -> str:
        name = super().start(component, name, *args)
        self._commands[name] = (component, args, dict(self.extra_env))
        if component == "scheduler":
            self.ports[name] = self.scheduler_ports[-1]
        return name

    def start_with(self, env: dict[str, str], component: str, name: str, *args: str) -> str:
        """Start a process with extra environment variables (a fault hook, say)."""
        saved = dict(self.extra_env)
        self.extra_env.update(env)
        try:
            return self.start(component, name, *args)
        finally:
            self.extra_env = saved

    def restart_scheduler(self, name: str) -> None:
        """Start the scheduler ``name`` again on the same port."""
        port = self.ports[name]
        cmd = [sys.executable, "-m", "asynctier", "run", "scheduler",
               "--listen", f"127.0.0.1:{port}"]
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=log,
                                            cwd=REPO)
        self.restarts[name] = self.restarts.get(name, 0) + 1

    def restart(self, name: str) -> None:
        """Start the process ``name`` again as it was started (a scheduler on its port)."""
        if name in self.ports:
            self.restart_scheduler(name)
            return
        component, args, env = self._commands[name]
        saved, self.extra_env = self.extra_env, env
        try:
            Platform.start(self, component, name, *args)
        finally:
            self.extra_env = saved
        self.restarts[name] = self.restarts.get(name, 0) + 1

    def kill(self, name: str) -> None:
        """SIGKILL a process and reap it (the supervisor restarts it only after)."""
        with self._lock:
            super().kill(name)

    def supervise(self, name: str, pause_s: float = 0.0) -> None:
        """Restart the process ``name`` whenever it dies, ``pause_s`` after it was seen
        dead (as systemd's ``RestartSec``), until :meth:`stop_all`."""
        self._supervised[name] = pause_s
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._watch, daemon=True)
            self._supervisor.start()

    def _watch(self) -> None:
        while not self._stopping.wait(0.1):
            for name, pause_s in list(self._supervised.items()):
                with self._lock:
                    if self.procs[name].poll() is None:
                        continue
                    dead = self._dead_since.setdefault(name, time.monotonic())
                    if time.monotonic() - dead >= pause_s and not self._stopping.is_set():
                        del self._dead_since[name]
                        self.restart(name)

    def stop_all(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        super().stop_all()

    # -- reading back ---------------------------------------------------------------------

    def calls(self) -> list[checker.Call]:
        """Every ledger line so far."""
        return checker.read_ledger(self.ledger)

    def dead_letters(self, binding: str) -> dict[int, str]:
        """id -> reason of the binding's dead letters."""
        return checker.dead_letter_ids(read_topic(self.settings, self.settings.names
                                                  .dlq_topic(binding)))

    def pending(self, binding: str, ladder_s: Sequence[float]) -> set[int]:
        """Ids of the binding's records in delay topics past the delay groups' commits."""
        names = self.settings.names
        ids: set[int] = set()
        for step in ladder_s:
            interval = format_duration(step)
            for msg in _uncommitted(self.settings, names.delay_topic(interval),
                                    names.delay_group(interval)):
                headers = record_headers(msg)
                if headers.get("asynctier.binding") == binding.encode():
                    try:
                        ids.add(int(json.loads(msg.value())["id"]))
                    except (TypeError, ValueError, KeyError):
                        continue
        return ids

    def log_text(self, name: str) -> str:
        """The whole log of a process."""
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _uncommitted(settings: Settings, topic: str, group: str) -> list[Any]:
    consumer = Consumer(settings.kafka_config(**{
        "group.id": group, "enable.auto.commit": False}))
    reader = Consumer(settings.kafka_config(**{
        "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        parts = [TopicPartition(topic, p) for p in meta.partitions]
        committed = consumer.committed(parts, timeout=10)
        starts, ends = {}, {}
        for tp in committed:
            low, high = reader.get_watermark_offsets(tp, timeout=10)
            start = tp.offset if tp.offset >= 0 else low
            if high > start:
                starts[tp.partition], ends[tp.partition] = start, high
        reader.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        out: list[Any] = []
        deadline = time.monotonic() + 15
        while ends and time.monotonic() < deadline:
            for msg in reader.consume(500, 0.5):
                part, offset = msg.partition(), msg.offset()
                if msg.error() or part is None or offset is None:
                    continue
                out.append(msg)
                if offset + 1 >= ends.get(part, 0):
                    ends.pop(part, None)
        return out
    finally:
        consumer.close()
        reader.close()


def make_docs(n: int, failing_every: int = 0, extra: dict[int, dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
    """``n`` records with ids 0..n-1; every ``failing_every``-th fails once (attempt 1)."""
    docs: list[dict[str, Any]] = []
    for i in range(n):
        doc: dict[str, Any] = {"id": i}
        if failing_every and i % failing_every == 0:
            doc["fail_until"] = 2
        doc.update((extra or {}).get(i, {}))
        docs.append(doc)
    return docs


def produce(settings: Settings, topic: str, docs: Sequence[dict[str, Any]]) -> None:
    """Produce the records (keyed by id) and wait until each is confirmed."""
    produce_json(settings, topic, docs, key_of="id")


def wait_resolved(plat: FaultPlatform, ids: Iterable[int], timeout_s: float,
                  dead_binding: str | None = None, expect_dead: int = 0) -> None:
    """Wait until every id ran to success, except ``expect_dead`` dead letters."""
    want = set(ids)

    def done() -> bool:
        ok = set(checker.succeeded(plat.calls()))
        missing = want - ok
        if len(missing) > expect_dead:
            return False
        if not missing:
            return True
        assert dead_binding is not None
        return missing <= set(plat.dead_letters(dead_binding))

    with contextlib.suppress(AssertionError):  # the checker reports what is missing
        wait_until(done, timeout_s, "every id succeeded or was dead-lettered", interval=0.5)


def report(plat: FaultPlatform, scenario: str, binding: str, ids: Iterable[int],
           ladder_s: Sequence[float], allowed_duplicates: int,
           results: list[Report], notes: Iterable[str] = ()) -> Report:
    """Check a scenario, keep its row for the run's table, print it."""
    result = checker.check(scenario, ids, plat.calls(), plat.dead_letters(binding),
                           plat.pending(binding, ladder_s), ladder_s, allowed_duplicates)
    result.notes.extend(notes)
    results.append(result)
    print("\n" + result.summary())
    return result


def on_progress(plat: FaultPlatform, count: int, timeout_s: float = 120.0) -> Callable[[], None]:
    """A waiter: returns once ``count`` calls are in the ledger."""
    def wait() -> None:
        wait_until(lambda: len(plat.calls()) >= count, timeout_s, f"{count} calls in the ledger",
                   interval=0.2)
    return wait
