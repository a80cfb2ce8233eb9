"""The image's entrypoint answers SIGTERM with the graceful drain: the tailers process
started as the chart starts it in the image (the Dockerfile's ENTRYPOINT, the Deployment's
args), outside a container, leaves rotation at once, finishes and commits the batch under
way, and exits 0 within the chart's grace period."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from asynctier.platform.config import Settings
from asynctier.platform.health import READYZ_PATH
from tests.deploy.chart import ROOT, deployment, render
from tests.faults.checker import succeeded
from tests.faults.harness import FaultPlatform, produce
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end, free_port


def image_command(helm: Path, role: str) -> tuple[list[str], int]:
    """(the command the image runs for ``role``, its pod's grace period in seconds): the
    ENTRYPOINT resolved to the console script pip installed beside this Python, as in the
    image, and the chart's args."""
    entrypoint = re.search(r"^ENTRYPOINT\s+(\[.*\])", (ROOT / "Dockerfile").read_text(), re.M)
    assert entrypoint is not None
    program, *fixed = json.loads(entrypoint.group(1))
    pod = deployment(render(helm), role)["spec"]["template"]["spec"]
    found = shutil.which(program, path=str(Path(sys.executable).parent))
    assert found is not None, f"{program} is not installed beside {sys.executable}"
    return [found, *fixed, *pod["containers"][0]["args"]], pod["terminationGracePeriodSeconds"]


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{READYZ_PATH}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_sigterm_to_the_image_command_drains_and_commits(
        helm: Path, settings: Settings, tmp_path: Path,
        unique_topic: Callable[..., str]) -> None:
    # the binding is of the default tier, normal: its Deployment's command runs it
    command, grace_s = image_command(helm, "tailers-normal")
    plat = FaultPlatform(settings, tmp_path)
    topic = unique_topic()
    port = free_port()
    log = open(tmp_path / "tailers.log", "wb")  # noqa: SIM115 - closed below
    try:
        plat.bind("drain", topic)
        plat.start("scheduler")
        proc = subprocess.Popen(command, env={**plat.env(), "ASYNCTIER_METRICS_PORT": str(port)},
                                stdout=log, stderr=log)
        wait_until(lambda: ready(port) == 200, 30, "the tailers ready")
        produce(settings, topic, [{"id": i, "sleep": 2} for i in range(4)])
        wait_until(lambda: len(plat.calls()) >= 1, 30, "a batch under way")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: ready(port) == 503, 2, "out of rotation at SIGTERM", interval=0.05)
        assert proc.wait(grace_s) == 0, (tmp_path / "tailers.log").read_text()
        took = time.monotonic() - sent
    finally:
        if "proc" in locals() and proc.poll() is None:
            proc.kill()
        log.close()
        plat.stop_all()
    assert set(succeeded(plat.calls())) == {0, 1, 2, 3}  # the batch under way finished
    committed, end = committed_vs_end(settings, settings.names.group("drain"), topic)
    assert committed == end == 4, (tmp_path / "tailers.log").read_text()
    assert took < grace_s
