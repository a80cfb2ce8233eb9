"""``python bench/flood.py [--records 50000]``: issue 4's retry flood, in one run.

The same number of records is drained twice by the default ``asynctier run``, each time
on a fresh platform (prefix) and topic: once bound to a function that succeeds
(``bench.noop:noop``), once to one that always fails (``bench.noop:fail``: every record goes
to the first delay topic). A failing function must not block its topic: the main topic's
drain rate under 100% failures must be at least 0.8x the all-success rate. Prints both
rates and the final line ``flood_ratio=<x>``; exits 1 when the ratio is under 0.8.

Kafka and Redis: ``ASYNCTIER_KAFKA_BOOTSTRAP`` / ``ASYNCTIER_REDIS_URL`` when set (running
services), else started for the run (see :mod:`bench.stack`).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402

from bench import scenarios  # noqa: E402
from bench.records import preload  # noqa: E402
from bench.stack import services  # noqa: E402

THRESHOLD = 0.8


def measure(records: int) -> tuple[float, float, str]:
    """(success rate, failure rate, where the failures went), records/s of the main topic."""
    with services() as svc, tempfile.TemporaryDirectory(prefix="asynctier-flood-") as tmp:
        folder = Path(tmp)
        tag = uuid.uuid4().hex[:6]
        ok_topic, fail_topic = f"bench-flood-ok-{tag}", f"bench-flood-fail-{tag}"
        preload(svc.kafka_bootstrap, ok_topic, records)
        preload(svc.kafka_bootstrap, fail_topic, records)
        ok = scenarios.asynctier_noop(svc, folder, ok_topic, records)
        fail = scenarios.asynctier_flood(svc, folder, fail_topic, records)
        return ok.rate, fail.rate, fail.note


def main(argv: list[str] | None = None) -> int:
    """Run both drains and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    args = parser.parse_args(argv)
    ok_rate, fail_rate, note = measure(args.records)
    ratio = fail_rate / ok_rate if ok_rate else 0.0
    print(f"all succeed:   {ok_rate:10,.0f} records/s drained from the main topic")
    print(f"all fail:      {fail_rate:10,.0f} records/s drained from the main topic ({note})")
    print(f"flood_ratio={ratio:.2f} (must be >= {THRESHOLD})")
    return 0 if ratio >= THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
