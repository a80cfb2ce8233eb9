"""``python bench/ab.py BEFORE_CHECKOUT [--rounds 5] [--records 200000] [--work KIND]``:
this checkout against another, interleaved, on one stack.

Each round runs ``bench/flood.py --rounds 1`` (a success drain and a 100%-failure drain
of the main topic, on a fresh platform) in the other checkout and in this one, one after
the other, every other round in reverse order, on the same Kafka and Redis (started here
unless ``ASYNCTIER_KAFKA_BOOTSTRAP`` / ``ASYNCTIER_REDIS_URL`` point at running ones). Each
checkout runs with its own ``.venv``. Prints each round and the medians; the final line
reads ``noop_ab=<after/before> flood_ab=<after/before>``.

``--work noop|sleep|asleep`` instead drains a fresh topic of ``--records`` with that work
(:mod:`bench.work`: the no-op, a 1 ms sync wait, a 1 ms async wait) by a default
``asynctier run`` of each checkout in turn, driven from this one (the other checkout's
code runs from its folder with this ``.venv``: its dependencies must match); the final line
reads ``<work>_ab=<after/before>`` of the medians' records/s.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

from bench.stack import services  # noqa: E402

_ROUND = re.compile(r"all succeed\s+([\d,]+)/s, all fail\s+([\d,]+)/s")


def one(checkout: Path, records: int, env: dict[str, str]) -> tuple[float, float]:
    """(success rate, flood rate) of one flood.py round in ``checkout``."""
    out = subprocess.run(
        [str(checkout / ".venv/bin/python"), str(checkout / "bench/flood.py"),
         "--records", str(records), "--rounds", "1", "--warmup-rounds", "0"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=900, check=False)
    found = _ROUND.search(out.stdout)
    if found is None:
        raise SystemExit(f"{checkout}: flood.py printed no round:\n{out.stdout}\n{out.stderr}")
    ok, fail = (float(x.replace(",", "")) for x in found.groups())
    return ok, fail


def drains(before: Path, work: str, records: int, rounds: int) -> int:
    """``--work``: each checkout drains ``records`` of ``work`` per round; the medians."""
    import tempfile

    from bench.records import preload
    from bench.scenarios import asynctier_work

    runs: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    with services() as svc, tempfile.TemporaryDirectory(prefix="asynctier-ab-") as folder:
        for number in range(rounds):
            order = [("before", before.resolve()), ("after", REPO)]
            for name, checkout in order if number % 2 == 0 else order[::-1]:
                topic = f"bench-ab-{work}-{name}-{number}-{os.getpid()}"
                preload(svc.kafka_bootstrap, topic, records)
                row = asynctier_work(svc, Path(folder), topic, records, work, checkout)
                runs[name].append(row.items / row.seconds)
                cpu[name].append(row.cpu_s / row.items * 1000)
                print(f"round {number + 1} {name:6}: {runs[name][-1]:8,.0f}/s, "
                      f"{cpu[name][-1]:.3f} CPU-s/1k", flush=True)
    for name in runs:
        print(f"{name:6}: {statistics.median(runs[name]):8,.0f}/s, "
              f"{statistics.median(cpu[name]):.3f} CPU-s/1k (medians of {rounds} rounds)")
    ratio = statistics.median(runs["after"]) / statistics.median(runs["before"])
    print(f"{work}_ab={ratio:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the other checkout (with its .venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--work", choices=("noop", "sleep", "asleep"),
                        help="drain this work in each checkout instead of flood.py")
    args = parser.parse_args(argv)
    if args.work:
        return drains(args.before, args.work, args.records, args.rounds)
    runs: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    with services() as svc:
        env = {**os.environ, "ASYNCTIER_KAFKA_BOOTSTRAP": svc.kafka_bootstrap,
               "ASYNCTIER_REDIS_URL": svc.redis_url}
        one(REPO, args.records, env)  # warm-up: the broker compiles the flood's path
        for number in range(args.rounds):
            order = [("before", args.before), ("after", REPO)]
            for name, checkout in order if number % 2 == 0 else order[::-1]:
                ok, fail = one(checkout.resolve(), args.records, env)
                runs[name].append((ok, fail))
                print(f"round {number + 1} {name:6}: all succeed {ok:8,.0f}/s, "
                      f"all fail {fail:8,.0f}/s, ratio {fail / ok:.2f}", flush=True)
    med = {name: (statistics.median(o for o, _ in got), statistics.median(f for _, f in got),
                  statistics.median(f / o for o, f in got)) for name, got in runs.items()}
    for name, (ok, fail, ratio) in med.items():
        print(f"{name:6}: no-op {ok:8,.0f}/s, flood {fail:8,.0f}/s, flood ratio {ratio:.2f} "
              f"(medians of {args.rounds} rounds)")
    print(f"noop_ab={med['after'][0] / med['before'][0]:.2f} "
          f"flood_ab={med['after'][2] / med['before'][2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
