"""A handler slower than ``max.poll.interval.ms``.

The tailer runs in this process with a small ``max.poll.interval.ms`` (7 s, the smallest the
broker's default ``group.min.session.timeout.ms`` allows with a 6 s session) against a real
scheduler process; three records' function takes 9 s, among 2,000 quick ones on two
partitions. The consumer must stay in its group: every record runs exactly once (leaving
the group would run the slow batches again and again without ever committing them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import SchedulerClient
from asynctier.tailers.kafka import KafkaTailer, TailerOptions
from tests.faults.checker import Report, read_ledger, succeeded
from tests.faults.harness import FaultPlatform, make_docs, produce, report
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end

SLEEP_S = 9.0
SLOW = (0, 700, 1400)
N = 2000


def test_handler_slower_than_max_poll_interval(settings: Settings, tmp_path: Path,
                                               unique_topic: Callable[..., str],
                                               fault_results: list[Report]) -> None:
    topic = unique_topic(2)
    produce(settings, topic, make_docs(N, extra={i: {"sleep": SLEEP_S} for i in SLOW}))
    plat = FaultPlatform(settings, tmp_path)
    stop = threading.Event()
    thread = None
    try:
        plat.bind("slow", topic, "--timeout", "60s")
        plat.start("scheduler")
        binding = BindingRegistry(settings).load()["slow"]
        client = SchedulerClient(lambda: [f"127.0.0.1:{plat.ports['scheduler']}"])
        options = TailerOptions(batch_size=100, session_timeout_ms=6000,
                                max_poll_interval_ms=7000)
        tailer = KafkaTailer(settings, binding, client, options)
        thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
        started = time.monotonic()
        thread.start()
        group = settings.names.group("slow")
        wait_until(lambda: committed_vs_end(settings, group, topic) == (N, N),
                   len(SLOW) * SLEEP_S * 2 + 60, "every record committed")
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        if thread is not None:
            thread.join(60)
        plat.stop_all()
    runs = succeeded(read_ledger(plat.ledger))
    print(f"\n{len(SLOW)} records of {SLEEP_S:g}s among {N} with max.poll.interval.ms=7000: "
          f"{elapsed:.1f}s, runs of the slow ones {[runs[i] for i in SLOW]}")
    result = report(plat, "handler slower than max.poll.interval.ms", "slow", range(N),
                    (30.0,), 0, fault_results)
    assert result.ok, result.summary()
