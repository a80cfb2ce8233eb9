"""A real Prometheus scrapes a real asynctier process, and lag is read back from its API.

The process is ``asynctier lag --metrics-port 0``, which exports the lag of every binding
from the broker; the binding's group has committed part of a real topic. Prometheus is
Debian's ``prometheus`` binary, started on a free port with a temporary configuration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from tests.helpers import wait_until
from tests.platform_harness import free_port

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = os.environ.get("ASYNCTIER_PROMETHEUS_BIN") or shutil.which("prometheus") \
    or "/usr/bin/prometheus"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def lag_exporter(settings: Settings, tmp_path: Path) -> Iterator[int]:
    """``asynctier lag --metrics-port 0`` for this test's prefix; yields its port."""
    env = dict(os.environ, ASYNCTIER_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
               ASYNCTIER_PREFIX=settings.prefix, ASYNCTIER_CONFIG="",
               PYTHONPATH=str(REPO))
    out = tmp_path / "exporter.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asynctier", "lag", "--metrics-port", "0",
             "--interval", "0.5"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        def port() -> int | None:
            assert proc.poll() is None, out.read_text()
            match = re.search(r"lag metrics on http://\S+:(\d+)/metrics", out.read_text())
            return int(match.group(1)) if match else None

        found = wait_until(port, 30, "the lag exporter printed its port")
        assert found is not None
        yield found
    finally:
        _stop(proc)


@pytest.fixture
def prometheus(lag_exporter: int, tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping the exporter every second; yields its base URL."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"prometheus is not installed at {PROMETHEUS} (Debian package prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "asynctier", "static_configs": [
            {"targets": [f"127.0.0.1:{lag_exporter}"]}]}],
    }))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url, proc, tmp_path), 60, "prometheus ready")
        yield url
    finally:
        _stop(proc)
        log.close()


def _ready(url: str, proc: subprocess.Popen[bytes], tmp_path: Path) -> bool:
    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def query(url: str, promql: str) -> dict[tuple[str, ...], float]:
    """An instant query: {(topic, partition) or labels...: value}."""
    qs = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=5) as resp:
        doc: dict[str, Any] = json.load(resp)
    assert doc["status"] == "success", doc
    return {tuple(r["metric"].get(k, "") for k in ("topic", "partition")): float(r["value"][1])
            for r in doc["data"]["result"]}


def test_prometheus_scrapes_lag_in_records_and_seconds(
        settings: Settings, unique_topic: Callable[..., str], prometheus: str) -> None:
    topic = unique_topic(partitions=2)
    BindingRegistry(settings).put(Binding(name="orders", source=Source("kafka", topic),
                                          function="m:f"))
    group = settings.names.group("orders")
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    ten_min_ago_ms = int(time.time() * 1000) - 600_000
    for i in range(10):
        producer.produce(topic, b"{}", partition=i % 2, timestamp=ten_min_ago_ms)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 2)],
                    asynchronous=False)
    url = prometheus  # the exporter follows the bindings live: it sees "orders" now

    lag = f'asynctier_consumer_lag{{group="{group}"}}'
    wait_until(lambda: query(url, lag) == {(topic, "0"): 0.0, (topic, "1"): 3.0}, 60,
               "Prometheus shows the lag of both partitions")
    ages = query(url, f'asynctier_consumer_lag_seconds{{group="{group}"}}')
    assert ages[(topic, "0")] == 0.0
    assert 600 <= ages[(topic, "1")] < 600 + 120

    for _ in range(4):  # lag grows ...
        producer.produce(topic, b"{}", partition=1)
    assert producer.flush(30) == 0
    wait_until(lambda: query(url, lag).get((topic, "1")) == 7.0, 30, "lag grew to 7")
    consumer.commit(offsets=[TopicPartition(topic, 1, 9)], asynchronous=False)  # ... and goes
    consumer.close()
    wait_until(lambda: query(url, f"sum({lag})") == {("", ""): 0.0}, 30, "lag back to 0")
