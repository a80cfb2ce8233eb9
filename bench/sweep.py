"""Record-to-start latency at several producer rates, in one run: where the latency target
stands below the rate ``make bench`` uses (half of the measured maximum).

    python -m bench.sweep [--rates 5000,15000,30000,40000] [--seconds 10] [--warmup 5000]

Each rate is the ``latency`` scenario of ``bench/run.py`` (an open-loop producer, a fresh
``asynctier run`` on the ``timed`` function) for ``--seconds``, preceded by its reference:
the same producer read by the raw confluent-kafka loop (record-to-receive). A first run at
``--warmup`` records/s is thrown away: a broker that has just started compiles its hot
paths for some 30 seconds, and records produced meanwhile wait up to a second whatever
consumes them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench import scenarios
from bench.stack import services


def main(argv: list[str]) -> int:
    """Run the sweep and print one line per rate."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="5000,15000,30000,40000")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=5000.0,
                   help="records/s of the discarded first run (0: none)")
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    folder = Path(tempfile.mkdtemp(prefix="asynctier-sweep-"))
    print(f"logs in {folder}", flush=True)
    with services() as svc:
        if args.warmup > 0:
            scenarios.latency(svc, folder, args.warmup, args.seconds)
        for rate in rates:
            for who, measure in (("raw loop", scenarios.raw_latency),
                                 ("asynctier", scenarios.latency)):
                lat = measure(svc, folder, rate, args.seconds)
                print(f"rate {rate:,.0f}/s for {args.seconds:g} s, {who}: "
                      f"{len(lat.samples):,} samples, "
                      + ", ".join(f"p{p:g} {lat.percentile(p):.1f} ms"
                                  for p in (50, 90, 99, 99.9))
                      + f" (producer late: p99 {lat.percentile(99, lat.producer_late):.1f}"
                      " ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
