"""Two regions, two schedulers each, tailers in region a (real Kafka, Redis and processes).

With a's schedulers healthy no call goes to b; with a saturated (a slow function, its
schedulers at capacity) calls spill to b up to the cap; with both of a's schedulers
SIGKILLed all work moves to b within 5 s and nothing is lost; with a restarted, work
returns to a. The default suite runs a short variant; ``--long`` a longer one.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from asynctier.platform.config import Settings
from asynctier.platform.membership import live_members
from tests.funcs import region as region_funcs
from tests.helpers import wait_until
from tests.platform_harness import REPO, Platform, free_port, produce_json

SPILL_SHARE = 0.5
SPILL_WINDOW = 10
CAPACITY = 10  # [scheduler] max_queued_items: small, so that a slow function fills it
#: The tailer's calls: at most this many records each, 8 under way (80 records: 4 times
#: a's room of 2 x 10, so a saturated a stays full between its beats).
BATCH = 10
#: While a is healthy, records come 5 at a time (one call), each group once the one
#: before ran: no scheduler of a registers more than 5 of its 10, even 2 s late. (The
#: tailer's 8 calls at once fill a on a slow machine, quick records or not.)
HEALTHY_STEP = 5
#: Records that fill a (80: every call the tailer has in flight), each working 0.5 s: a stays
#: full for seconds, longer than its schedulers' beat (1 s) and the tailer's cached read of
#: the membership (1 s) together, so that the tailer sees it full.
FILL = 80
FILL_S = 0.5


@dataclass(frozen=True)
class Scenario:
    """How much work each phase holds."""

    healthy: int  # quick records while a is healthy
    saturate: int  # slow records (sleep ``slow_s``) once a spills
    slow_s: float
    failover: int  # records under way when a's schedulers are killed
    back: int  # quick records after a is back
    # every record of the failover phase finished within this of the kill (None: b needs
    # longer than that for the work itself; then only its take-over is bounded). Short:
    # b's own 1 s of work takes 3-4 s on a loaded 2-core machine, hence 8.
    drained_within_s: float | None


#: Work moves to b within this of the kill: the first record unfinished at the kill
#: finishes in b within it.
MOVED_WITHIN_S = 5.0
SHORT = Scenario(healthy=30, saturate=100, slow_s=0.05, failover=80, back=30,
                 drained_within_s=8.0)
LONG = Scenario(healthy=300, saturate=2400, slow_s=0.05, failover=1200, back=300,
                drained_within_s=None)


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's processes (regions set per process); stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.region",))
    (tmp_path / "asynctier.toml").write_text(
        "[asynctier]\n"
        f"spill_share = {SPILL_SHARE}\n"
        f"spill_window = {SPILL_WINDOW}\n"
        "[scheduler]\n"
        "workers = 2\n"
        f"max_queued_items = {CAPACITY}\n"
        "[kafka]\n"
        f'"bootstrap.servers" = "{settings.kafka_bootstrap}"\n'
        '"session.timeout.ms" = "6000"\n"heartbeat.interval.ms" = "1000"\n')
    yield plat
    plat.stop_all()


def start_in(plat: Platform, region: str, component: str, name: str, *args: str) -> None:
    """Start a process of ``region``."""
    plat.extra_env["ASYNCTIER_REGION"] = region
    plat.start(component, name, *args)


def start_schedulers(plat: Platform, named: dict[str, str]) -> dict[str, int]:
    """Start schedulers (name -> region) at once (one after the other takes long on a busy
    machine); returns their ports, for :func:`wait_listening`."""
    ports = {}
    for name, region in named.items():
        ports[name] = port = free_port()
        plat.scheduler_ports.append(port)
        env = {**plat.env(), "ASYNCTIER_REGION": region}
        log = open(plat.folder / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        plat.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "asynctier", "run", "scheduler", "--listen",
             f"127.0.0.1:{port}"], env=env, stdout=log, stderr=log, cwd=REPO)
    return ports


def wait_listening(plat: Platform, ports: dict[str, int]) -> None:
    """Wait until each scheduler started by :func:`start_schedulers` listens."""
    for name, port in ports.items():
        plat._wait_port(port, name, 60.0)


class LoadSampler:
    """Samples the registered load of every scheduler (5 times a second) while in use;
    ``peak``: the highest summed load seen per region."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            summed: Counter[str] = Counter()
            for m in live_members(self.settings):
                summed[m.region] += m.load
            for region, load in summed.items():
                self.peak[region] = max(self.peak.get(region, 0), load)


def regions_live(settings: Settings) -> Counter[str]:
    """Live schedulers per region."""
    return Counter(m.region for m in live_members(settings))


def region_calls(port: int) -> dict[tuple[str, str], float]:
    """The tailer's calls by (region, reason), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = {}
    for m in re.finditer(r"^asynctier_region_calls_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        found[(labels["region"], labels["reason"])] = float(m.group(2))
    return found


def ran(plat: Platform, ids: range) -> dict[int, list[region_funcs.Ran]]:
    """The ledger's lines of ``ids``, by id."""
    out: dict[int, list[region_funcs.Ran]] = {}
    for line in region_funcs.read(plat.ledger):
        if line.id in ids:
            out.setdefault(line.id, []).append(line)
    return out


def all_ran(plat: Platform, ids: range) -> Callable[[], bool]:
    """A condition: every id of ``ids`` finished at least once."""
    return lambda: len(ran(plat, ids)) == len(ids)


def produce(settings: Settings, topic: str, ids: range, sleep_s: float = 0.0) -> None:
    """Records of ``ids``, each working ``sleep_s``."""
    produce_json(settings, topic, [{"id": i, "sleep": sleep_s} for i in ids], key_of="id")


def full(settings: Settings, region: str) -> bool:
    """True when every live scheduler of ``region`` registered a load at its capacity."""
    members = [m for m in live_members(settings) if m.region == region]
    return bool(members) and all(m.spot.full for m in members)


class Trickle:
    """Records of consecutive ids from ``start``, :data:`BATCH` (one call) per :meth:`more`."""

    def __init__(self, settings: Settings, topic: str, start: int, sleep_s: float) -> None:
        self.settings = settings
        self.topic = topic
        self.next = start
        self.sleep_s = sleep_s

    def more(self) -> bool:
        """Produce the next call's worth; True (a condition's first half)."""
        produce(self.settings, self.topic, range(self.next, self.next + BATCH), self.sleep_s)
        self.next += BATCH
        return True


def feed_gently(plat: Platform, settings: Settings, topic: str, ids: range) -> None:
    """Quick records of ``ids``, :data:`HEALTHY_STEP` at a time, each group once the one
    before ran: a region that has room keeps it."""
    for start in ids[::HEALTHY_STEP]:
        step = range(start, min(start + HEALTHY_STEP, ids.stop))
        produce(settings, topic, step)
        wait_until(all_ran(plat, step), 60, "the quick records ran")


def scenario(plat: Platform, settings: Settings, topic: str, s: Scenario) -> None:
    began = time.monotonic()
    plat.cli("bind", "placed", "--topic", topic, "--function", "tests.funcs.region:where",
             "--idempotent")  # no run-once claim to wait out after the kill
    ports = start_schedulers(plat, {"scheduler-a1": "a", "scheduler-a2": "a",
                                    "scheduler-b1": "b", "scheduler-b2": "b"})
    metrics_port = free_port()
    start_in(plat, "a", "tailers", "tailers-a", "--batch-size", str(BATCH), "--max-in-flight", "8",
             "--metrics-port", str(metrics_port))
    wait_listening(plat, ports)
    wait_until(lambda: regions_live(settings) == Counter(a=2, b=2), 15,
               "two schedulers registered in each region")

    # 1. a healthy: nothing leaves a
    first = range(0, s.healthy)
    feed_gently(plat, settings, topic, first)
    where = Counter(r.region for lines in ran(plat, first).values() for r in lines)
    print(f"\nhealthy ({time.monotonic() - began:.1f} s in): {dict(where)}")
    assert set(where) == {"a"}, where
    calls = region_calls(metrics_port)
    assert set(calls) == {("a", "home")}, calls

    # 2. a saturated: calls spill to b, within the cap
    fill = range(100_000, 100_000 + FILL)
    with LoadSampler(settings) as loads:
        produce(settings, topic, fill, FILL_S)
        wait_until(lambda: full(settings, "a"), 15, "a's schedulers registered full")
        trickle = Trickle(settings, topic, fill.stop, s.slow_s)
        # a call placed before the tailer read a full a stays home: a call's worth of
        # records at a time until one spills (a stays full from the fill meanwhile)
        wait_until(lambda: trickle.more() and region_calls(metrics_port).get(("b", "spill"), 0)
                   > 0, 20, "a call spilled to b while a was full", interval=0.2,
                   max_interval=0.2)
        produce(settings, topic, range(trickle.next, trickle.next + s.saturate), s.slow_s)
        slow = range(100_000, trickle.next + s.saturate)
        wait_until(all_ran(plat, slow), 120, "the slow records ran")
    print(f"saturated: peak registered load per region {loads.peak} (capacity {CAPACITY} "
          "per scheduler)")
    where = Counter(r.region for lines in ran(plat, slow).values() for r in lines)
    after = region_calls(metrics_port)
    home = after.get(("a", "home"), 0) - calls.get(("a", "home"), 0)
    spill = after.get(("b", "spill"), 0)
    share = spill / (home + spill)
    print(f"saturated ({time.monotonic() - began:.1f} s in): items {dict(where)}; calls "
          f"home {home:.0f}, spilled {spill:.0f} ({share:.0%} of calls; cap "
          f"{SPILL_SHARE:.0%} of every {SPILL_WINDOW} calls)")
    assert where["b"] > 0, "a full region spilled nothing"
    assert spill <= SPILL_SHARE * (home + spill) + SPILL_WINDOW * SPILL_SHARE
    assert ("b", "no_home") not in after

    # 3. a's schedulers SIGKILLed mid-stream: all work in b within 5 s, nothing lost
    moving = range(200_000, 200_000 + s.failover)
    produce(settings, topic, moving, s.slow_s)
    # Polled every 20 ms: the phase holds about a second of a's work, and a poll that
    # grows to 0.5 s can see the tenth record only after the last one ran.
    wait_until(lambda: sum(1 for lines in ran(plat, moving).values()
                           if lines[0].region == "a") >= 10, 30,
               "region a runs the records of the failover phase", interval=0.02,
               max_interval=0.02)
    plat.kill("scheduler-a1")
    plat.kill("scheduler-a2")
    killed = time.time()
    wait_until(all_ran(plat, moving), 60, "every record of the failover phase ran")
    lines = ran(plat, moving)
    finished = max(r.at for group in lines.values() for r in group)
    unfinished = [group for group in lines.values() if min(r.at for r in group) > killed]
    assert unfinished, "the kill came after the work: nothing was left to move"
    resumed = min(r.at for group in unfinished for r in group) - killed
    in_a_after = [r for group in lines.values() for r in group
                  if r.region == "a" and r.at > killed + 0.5]
    late = finished - killed
    print(f"failover ({time.monotonic() - began:.1f} s in): {len(unfinished)} record(s) "
          f"unfinished at the kill; the first finished in b {resumed:.2f} s after it, the "
          f"last {late:.2f} s after it; {sum(len(g) - 1 for g in lines.values())} ran twice")
    assert not in_a_after, in_a_after[:3]
    assert resumed <= MOVED_WITHIN_S, f"b took {resumed:.2f} s after the kill to take over"
    if s.drained_within_s is not None:
        assert late <= s.drained_within_s, f"the work took {late:.2f} s to finish in b"
    assert region_calls(metrics_port).get(("b", "no_home"), 0) > 0

    # 4. a restarted: work returns to a
    wait_listening(plat, start_schedulers(plat, {"scheduler-a3": "a", "scheduler-a4": "a"}))
    wait_until(lambda: regions_live(settings)["a"] == 2, 15, "a's schedulers are back")
    restarted = time.time()
    probe = range(300_000, 300_010)
    produce(settings, topic, probe)
    wait_until(all_ran(plat, probe), 30, "the probe records ran")
    back = range(400_000, 400_000 + s.back)
    feed_gently(plat, settings, topic, back)
    where = Counter(r.region for group in ran(plat, back).values() for r in group)
    first_home = min((r.at for group in ran(plat, range(300_000, 400_000 + s.back)).values()
                      for r in group if r.region == "a"), default=float("nan"))
    print(f"back ({time.monotonic() - began:.1f} s in): {dict(where)}; the first item ran "
          f"in a {first_home - restarted:.2f} s after a's schedulers registered")
    assert set(where) == {"a"}, where


@pytest.mark.timeout(300)
def test_regions_short(platform: Platform, settings: Settings,
                       unique_topic: Callable[..., str]) -> None:
    scenario(platform, settings, unique_topic(2), SHORT)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_regions_long(platform: Platform, settings: Settings,
                      unique_topic: Callable[..., str]) -> None:
    scenario(platform, settings, unique_topic(4), LONG)
