"""`asynctier demo`, the end of the README's first command, runs to its summary: the
stream workloads through Kafka, and the queue workload through PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys

from asynctier.demo import graph, transcode


def test_demo_processes_every_record_and_prints_a_summary(kafka_bootstrap: str,
                                                           redis_url: str,
                                                           postgres: str) -> None:
    env = dict(os.environ, ASYNCTIER_KAFKA_BOOTSTRAP=kafka_bootstrap,
               ASYNCTIER_REDIS_URL=redis_url, ASYNCTIER_QUEUE_SHARDS=postgres, COLUMNS="120")
    done = subprocess.run([sys.executable, "-m", "asynctier", "demo", "--timeout", "120"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    print(out[out.find("asynctier demo: summary") - 200:])
    assert "asynctier demo: summary" in out
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.splitlines() if line.count("│") == 3}
    assert rows["records"] == "5500"
    processed, letters = int(rows["processed"]), int(rows["dead letters (in the dead-letter "
                                                         "topics)"])
    assert processed + letters == 5500
    assert letters > 0  # the corrupt uploads
    assert int(rows["retried (calls after a failure)"]) > 0  # the flaky transcoder

    # The queue workload: every item ran or is a dead item, by priority.
    assert rows["queue items (transcode)"] == str(transcode.COUNT)
    ran, dead = int(rows["queue items ran"]), int(rows["queue dead items (in the queue)"])
    assert dead == transcode.expected_rejects() > 0  # the corrupt videos
    assert ran + dead == transcode.COUNT
    medians = [float(rows[f"queue priority {p} ({what}): median start"].strip("+ s"))
               for p, what in transcode.BANDS]
    assert medians == sorted(medians) and medians[0] < medians[-1], medians
    assert rows["queue: higher priorities started first"] == "yes"

    # The upload graph and the schedule: each publish ran after its three encodes, or
    # died with the encode that failed; the nightly schedule fired.
    assert rows["uploads (3 encodes, then a publish)"] == str(graph.UPLOADS)
    assert rows["publishes parent_failed (an encode failed)"] == str(len(graph.BROKEN))
    assert int(rows["uploads published (after their 3 encodes)"]) == \
        graph.UPLOADS - len(graph.BROKEN)
    assert int(rows[f"schedule nightly (every {graph.EVERY_S} s): ticks fired"]) >= 2
