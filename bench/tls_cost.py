"""``python bench/tls_cost.py [--records 200000] [--rounds 5]``: what mutual TLS on the
tailer -> scheduler link costs the no-op drain.

Each round drains the same topic with the default ``asynctier run`` twice, each time on a
fresh platform (prefix, so its own consumer group): once in plaintext (``[rpc] insecure``,
the loopback default) and once with mutual TLS (``ASYNCTIER_RPC_CA``/``_CERT``/``_KEY``,
certificates made by :func:`asynctier.dev.certs.write_certs`), every other round in
reverse order, after ``--warmup-rounds`` discarded ones. Prints each round, the medians,
then the final line ``tls_ratio=<mTLS rate / plaintext rate>`` (median of the rounds'
ratios; goal >= 0.90).

Kafka and Redis: ``ASYNCTIER_KAFKA_BOOTSTRAP`` / ``ASYNCTIER_REDIS_URL`` when set, else
started for the run (see :mod:`bench.stack`).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402

from asynctier.dev.certs import write_certs  # noqa: E402
from bench import scenarios  # noqa: E402
from bench.asynctier_run import free_port  # noqa: E402
from bench.records import preload  # noqa: E402
from bench.stack import Services, services  # noqa: E402

GOAL = 0.90
#: What each run's scheduler must say it runs (its start line, ``rpcsecurity.describe``).
MODES = {"plain": "plaintext (insecure", "mtls": "mutual TLS"}


def drain(svc: Services, folder: Path, topic: str, records: int, label: str,
          env: dict[str, str]) -> float:
    """Records/s of one no-op drain of ``topic`` on a fresh platform with ``env``."""
    # the Submitter `asynctier run` starts too: a free port, not the default 50061
    env = {**env, "ASYNCTIER_SUBMITTER_LISTEN": f"127.0.0.1:{free_port()}"}
    with scenarios.platform(svc, folder, label, env) as run:
        run.bind("noop", topic, "noop")
        rate = scenarios.drain_asynctier(svc, run, topic, records, "noop").rate
        mode = MODES[label]
        if f"{mode})" not in run.log.read_text(errors="replace"):  # the scheduler's start line
            raise SystemExit(f"the {label} scheduler did not say it runs {mode}: {run.log}")
        return rate


def measure(records: int, rounds: int, warmup_rounds: int) -> list[tuple[float, float]]:
    """(plaintext rate, mTLS rate) per measured round."""
    got: list[tuple[float, float]] = []
    with services() as svc, tempfile.TemporaryDirectory(prefix="asynctier-tls-") as tmp:
        folder = Path(tmp)
        certs = write_certs(folder / "certs")
        envs = {"plain": {"ASYNCTIER_RPC_INSECURE": "true"},
                "mtls": {"ASYNCTIER_RPC_CA": str(certs.ca),
                         "ASYNCTIER_RPC_CERT": str(certs.server),
                         "ASYNCTIER_RPC_KEY": str(certs.server_key)}}
        topic = f"bench-tls-{uuid.uuid4().hex[:6]}"
        preload(svc.kafka_bootstrap, topic, records)
        for number in range(warmup_rounds + rounds):
            order = ["plain", "mtls"] if number % 2 == 0 else ["mtls", "plain"]
            rates = {kind: drain(svc, folder, topic, records, kind, envs[kind])
                     for kind in order}
            plain, mtls = rates["plain"], rates["mtls"]
            if number < warmup_rounds:
                print(f"warm-up:  plaintext {plain:8,.0f}/s, mTLS {mtls:8,.0f}/s (discarded)")
                continue
            got.append((plain, mtls))
            print(f"round {len(got)} ({' then '.join(order)}):  plaintext {plain:8,.0f}/s, "
                  f"mTLS {mtls:8,.0f}/s, ratio {mtls / plain if plain else 0.0:.2f}",
                  flush=True)
    return got


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the median ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup-rounds", type=int, default=1)
    args = parser.parse_args(argv)
    got = measure(args.records, max(1, args.rounds), max(0, args.warmup_rounds))
    ratio = statistics.median(m / p if p else 0.0 for p, m in got)
    print(f"plaintext: {statistics.median(p for p, _ in got):10,.0f} records/s (median of "
          f"{len(got)} rounds of {args.records:,})")
    print(f"mTLS:      {statistics.median(m for _, m in got):10,.0f} records/s")
    print(f"tls_ratio={ratio:.2f} (median of the rounds' ratios; goal >= {GOAL})")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
