"""``run_scheduler`` as a process: SIGTERM stops accepting, finishes the call under way,
leaves the membership and exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from asynctier.platform.config import Settings
from asynctier.platform.membership import live_schedulers
from asynctier.platform.rpc import SchedulerClient
from tests.helpers import wait_until
from tests.scheduler_harness import item

SERVE = textwrap.dedent("""
    import logging, sys
    from asynctier.platform.binding import Binding
    from asynctier.platform.binding_features import Source
    from asynctier.platform.config import Settings
    from asynctier.scheduler import run_scheduler
    from asynctier.platform.binding_source import StaticBindings
    logging.basicConfig(level=logging.INFO)
    settings = Settings(redis_url=sys.argv[1], prefix=sys.argv[2])
    slow = Binding("slow", Source("kafka", "t"), "tests.funcs.basic:marked_sleepy")
    run_scheduler(settings, listen="127.0.0.1:0", allow_modules=["tests.funcs.basic"],
                  bindings=StaticBindings([slow]),
                  ready_callback=lambda address: print("READY", address, flush=True))
""")


def test_sigterm_finishes_the_call_under_way(settings: Settings, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", SERVE, settings.redis_url, settings.prefix],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line + (proc.stderr.read() if proc.stderr else "")
        address = line.split()[1]
        assert live_schedulers(settings) == [address]
        client = SchedulerClient(lambda: [address])
        payload = json.dumps({"sleep": 1.0, "mark": str(tmp_path)}).encode()
        call = client.submit([item("slow", n, payload) for n in range(4)])
        wait_until(lambda: any(tmp_path.iterdir()), 30, "the call is under way")
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        outcomes = call.result()
        assert sorted(o["id"] for o in outcomes) == [0, 1, 2, 3]
        assert all(o["status"] == "ok" for o in outcomes), outcomes
        assert proc.wait(timeout=30) == 0
        print(f"\nexited 0, {time.monotonic() - started:.1f} s after SIGTERM")
        wait_until(lambda: live_schedulers(settings) == [], 5, "the scheduler left")
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
