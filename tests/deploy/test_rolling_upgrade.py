"""A rolling upgrade on one stack: tailers and a scheduler of an earlier commit drain a
topic, this commit's start beside them, then the old ones get SIGTERM one role at a time
(as `helm upgrade` rolls the Deployments); every record runs, every offset is committed.

The earlier commit is ``$ASYNCTIER_UPGRADE_FROM`` (default ``HEAD~1``), exported with
``git archive`` and run from its own folder with this environment's packages. Behind
``--long``: it needs the repository's history and takes about a minute.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import pytest

from asynctier.platform.config import Settings
from tests.deploy.chart import ROOT
from tests.faults.checker import succeeded
from tests.faults.harness import FaultPlatform, produce
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end, free_port

RECORDS = 600


@pytest.fixture
def old_tree(tmp_path: Path) -> Path:
    """The earlier commit's files, or a skip saying why there are none."""
    rev = os.environ.get("ASYNCTIER_UPGRADE_FROM", "HEAD~1")
    done = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                          timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"no commit {rev} to upgrade from: {done.stderr.decode()[:200]}")
    folder = tmp_path / "old"
    with tarfile.open(fileobj=BytesIO(done.stdout)) as archive:
        archive.extractall(folder, filter="data")
    return folder


class Upgrade(FaultPlatform):
    """The platform, where a process's name starting with ``old-`` runs the old tree."""

    def __init__(self, settings: Settings, folder: Path, old: Path) -> None:
        super().__init__(settings, folder)
        self.old = old

    def start_old(self, component: str) -> str:
        name = f"old-{component}"
        cmd = [sys.executable, "-m", "asynctier", "run", component]
        if component == "scheduler":
            port = free_port()
            self.scheduler_ports.append(port)
            cmd += ["--listen", f"127.0.0.1:{port}"]
        env = {**self.env(), "PYTHONPATH": str(self.old)}
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log,
                                            cwd=self.old)
        if component == "scheduler":
            self._wait_port(port, name)
        return name


@pytest.fixture
def plat(settings: Settings, tmp_path: Path, old_tree: Path) -> Iterator[Upgrade]:
    platform = Upgrade(settings, tmp_path, old_tree)
    try:
        yield platform
    finally:
        platform.stop_all()


@pytest.mark.slow
def test_old_and_new_side_by_side_drain_a_topic_with_nothing_lost(
        plat: Upgrade, settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(partitions=4)
    plat.bind("roll", topic)
    old_pid = plat.procs[plat.start_old("scheduler")].pid
    plat.start_old("tailers")
    half = RECORDS // 2
    produce(settings, topic, [{"id": i, "sleep": 0.05} for i in range(half)])
    wait_until(lambda: len(succeeded(plat.calls())) >= half // 4, 60,
               "the old tailers and scheduler draining")
    plat.start("scheduler", "new-scheduler")
    plat.start("tailers", "new-tailers")
    produce(settings, topic, [{"id": i, "sleep": 0.05} for i in range(half, RECORDS)])
    new_pid = plat.procs["new-scheduler"].pid
    wait_until(lambda: any(c.pid == new_pid for c in plat.calls()), 60,
               "the new scheduler running records beside the old one")
    for name in ("old-tailers", "old-scheduler"):  # the rollout replaces them in turn
        plat.procs[name].send_signal(signal.SIGTERM)
        assert plat.procs[name].wait(60) == 0, plat.log(name)
    wait_until(lambda: len(succeeded(plat.calls())) == RECORDS, 120, "every record run")
    wait_until(lambda: committed_vs_end(settings, settings.names.group("roll"), topic)
               == (RECORDS, RECORDS), 60, "every offset committed")
    runs = succeeded(plat.calls())
    assert set(runs) == set(range(RECORDS))
    ran_in = {c.pid for c in plat.calls() if c.kind == "D"}
    assert {old_pid, new_pid} <= ran_in  # both versions ran records
    twice = sorted(i for i, n in runs.items() if n > 1)
    print(f"{RECORDS} records, {len(twice)} run twice: {twice[:20]}")
