"""A plain ``asynctier run`` tails each priority tier's bindings in a process of its own, at
the tier's CPU niceness, and runs the urgent tier's records in a scheduler kept for it
(docs/operations.md, Running): real Kafka and Redis, the real ``asynctier run`` and its
children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from asynctier.dev.process import free_port
from asynctier.platform.binding import NICENESS
from asynctier.platform.config import Settings
from asynctier.platform.membership import live_members
from asynctier.platform.status import status_key
from tests.funcs.whereabouts import ran_in
from tests.helpers import wait_until
from tests.platform_harness import REPO, Platform, produce_json

RECORDS = 5


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    plat = Platform(settings, tmp_path, allow=("tests.funcs.whereabouts",))
    yield plat
    plat.stop_all()


def tailers_of(settings: Settings) -> dict[str, set[tuple[int, str]]]:
    """Binding -> (pid, component) of each process whose status board lists its tailer."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        fields = client.hgetall(status_key(settings))
    finally:
        client.close()
    found: dict[str, set[tuple[int, str]]] = {}
    for field, raw in fields.items():
        _, pid, component = str(field).split(":", 2)
        for loop in json.loads(raw)["loops"]:
            found.setdefault(loop, set()).add((int(pid), component))
    return found


def tier_of(proc: psutil.Process) -> str | None:
    """The ``--tier`` a child was started with."""
    argv = proc.cmdline()
    return argv[argv.index("--tier") + 1] if "--tier" in argv else None


def child(children: dict[int, psutil.Process], component: str, tier: str | None) -> int:
    """The pid of the one child running ``component`` for ``tier``."""
    [pid] = [pid for pid, proc in children.items()
             if component in proc.cmdline() and tier_of(proc) == tier]
    return pid


def pids_of(platform: Platform, binding: str, ids: range) -> set[int]:
    """The pids that ran ``binding``'s records of ``ids``, once each of them ran."""
    ran = [(i, pid) for name, i, pid in ran_in(platform.ledger)
           if name == binding and i in ids]
    return {pid for _, pid in ran} if {i for i, _ in ran} == set(ids) else set()


def thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of process ``pid``."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        found.add(int(stat[stat.rfind(")") + 2:].split()[16]))  # field 19: nice
    return found


@pytest.mark.timeout(240)
def test_a_plain_run_tails_each_tier_in_a_process_of_its_own_at_its_niceness(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings) -> None:
    fn = "tests.funcs.whereabouts:note_pid"
    topics = {"now": unique_topic(), "later": unique_topic()}
    platform.cli("bind", "now", "--topic", topics["now"], "--function", fn,
                 "--priority", "urgent")
    platform.cli("bind", "later", "--topic", topics["later"], "--function", fn,
                 "--priority", "batch")
    address = f"127.0.0.1:{free_port()}"
    env = {**platform.env(), "ASYNCTIER_SCHEDULER_LISTEN": address,
           "ASYNCTIER_SCHEDULERS": address}
    log = platform.folder / "run.log"
    for topic in topics.values():  # waiting when the tailers start
        produce_json(settings, topic, [{"id": i} for i in range(RECORDS)])
    with open(log, "ab") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "asynctier", "run", "--submitter-listen",
             f"127.0.0.1:{free_port()}"], env=env, stdout=out, stderr=out, cwd=REPO)
    try:
        # a tailer sends to any scheduler while none of its tier's is registered: the
        # tailers start once both schedulers are
        wait_until(lambda: any("tailers" in c.cmdline()
                               for c in psutil.Process(run.pid).children()), 60,
                   "a tailers process started")
        assert {m.tier for m in live_members(settings)} >= {None, "urgent"}
        first = range(RECORDS)
        wait_until(lambda: all(pids_of(platform, b, first) for b in topics),
                   120, "both bindings' records ran")
        wait_until(lambda: {"now", "later"} <= set(tailers_of(settings)), 30,
                   "both tailers on a status board")
        tailing = tailers_of(settings)
        children = {c.pid: c for c in psutil.Process(run.pid).children()}
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        for binding, tier in (("now", "urgent"), ("later", "batch")):
            [(pid, component)] = tailing[binding]
            assert pid in children, f"{binding}'s tailer is not a child of `asynctier run`"
            assert component == f"tailers {tier}"
            assert tier_of(children[pid]) == tier
            assert thread_niceness(pid) == {ours + NICENESS[tier]}, binding
        assert tailing["now"] != tailing["later"]
        normal = children[child(children, "tailers", "normal")]
        assert normal.nice() == ours + NICENESS["normal"]
        # the urgent records ran in the scheduler kept for them, the others in the other
        urgent_scheduler = child(children, "scheduler", "urgent")
        assert pids_of(platform, "now", first) == {urgent_scheduler}
        assert pids_of(platform, "later", first) == {child(children, "scheduler", None)}
        # re-bound to another tier, its tailer moves to that tier's process
        platform.cli("bind", "later", "--topic", topics["later"], "--function", fn,
                     "--priority", "urgent")
        wait_until(lambda: tailers_of(settings).get("later") == tailing["now"], 60,
                   "the re-bound binding's tailer in the urgent process alone")
        then = range(RECORDS, 2 * RECORDS)
        produce_json(settings, topics["later"], [{"id": i} for i in then])
        wait_until(lambda: pids_of(platform, "later", then), 60,
                   "the re-bound binding's new records ran")
        assert pids_of(platform, "later", then) == {urgent_scheduler}
    finally:
        run.send_signal(signal.SIGTERM)
        code = run.wait(120)
    assert code == 0, log.read_text()[-3000:]
