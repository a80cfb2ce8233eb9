"""``python -m bench.tracing_cost [--records 100000] [--rounds 3]``: what tracing costs the
no-op drain.

Each round drains a fresh topic of ``--records`` no-op records three times, by a default
``asynctier run`` each time, in a rotating order: tracing off, on with 1% of new traces
kept, and on with every trace kept (spans exported over OTLP to a Jaeger this bench starts,
as a user's collector would take them). The final line reads ``tracing_1pct=<on/off>
tracing_100pct=<on/off>`` of the medians' records/s. Write the figures to RESULTS.md with
the command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from asynctier.dev.testing import start_test_jaeger
from bench.asynctier_run import COMPONENTS
from bench.records import preload
from bench.scenarios import drain_asynctier, platform
from bench.stack import services

#: The cases: name, and the environment of the run (OTEL_* as a user would set them).
CASES: dict[str, dict[str, str]] = {
    "off": {},
    "1%": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "100%": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "1"},
}


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; print each drain, the medians and the final line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {name: [] for name in CASES}
    cpu: dict[str, list[float]] = {name: [] for name in CASES}
    with services() as svc, tempfile.TemporaryDirectory(prefix="asynctier-trace-") as folder:
        jaeger = start_test_jaeger(Path(folder))
        try:
            for number in range(args.rounds):
                names = list(CASES)
                names = names[number % 3:] + names[:number % 3]
                for name in names:
                    topic = f"bench-trace-{number}-{names.index(name)}-{os.getpid()}"
                    preload(svc.kafka_bootstrap, topic, args.records)
                    env = {**CASES[name], "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.endpoint}
                    label = "trace-" + name.replace("%", "pct")
                    with platform(svc, Path(folder), label, env) as run:
                        run.bind("noop", topic, "noop")
                        drain = drain_asynctier(svc, run, topic, args.records, "noop")
                    own = sum(drain.cpu_s.get(k, 0.0) for k in ("run", *COMPONENTS))
                    rates[name].append(drain.items / drain.seconds)
                    cpu[name].append(own / drain.items * 1000)
                    print(f"round {number + 1} tracing {name:4}: {rates[name][-1]:8,.0f}/s, "
                          f"{cpu[name][-1]:.3f} CPU-s/1k", flush=True)
        finally:
            jaeger.stop()
    medians = {name: statistics.median(got) for name, got in rates.items()}
    for name, rate in medians.items():
        print(f"tracing {name:4}: {rate:8,.0f}/s, {statistics.median(cpu[name]):.3f} "
              f"CPU-s/1k (medians of {args.rounds} rounds)")
    print(f"tracing_1pct={medians['1%'] / medians['off']:.2f} "
          f"tracing_100pct={medians['100%'] / medians['off']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
