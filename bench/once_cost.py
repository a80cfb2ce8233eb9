"""What the run-once guard costs Redis and the scheduler: CPU and memory per record.

    python -m bench.once_cost [--records 100000] [--rounds 3] [--batch 1000]

Takes ``--records`` records (batches of ``--batch`` records of 4 partitions of one topic,
as a tailer reads them) with :class:`RunOnce` and writes them down, once all succeeding
and once all failing, each way a record can be taken: claimed (a guarded record) and in
running ranges (a fresh one, docs/design.md "Run once off the path"); ``--rounds`` times,
and prints the medians: Redis' own CPU (``INFO cpu``), this process's CPU (the
scheduler's share of the guard) and the growth of Redis' ``used_memory`` per record. A
drain sends batches of 1,000; at half load, of about 300. The successes stay in Redis for
the run-once window, which is what the memory figure is about; failures leave nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import redis as sync_redis
from redis.asyncio import Redis

from asynctier.platform.config import Settings
from asynctier.platform.wire import Item, ok, retry
from asynctier.scheduler.guard import RUN
from asynctier.scheduler.limits.once import RunOnce
from bench.stack import services


def _cpu_s(client: sync_redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _run(url: str, settings: Settings, n: int, succeed: bool, fresh: bool,
               batch: int) -> tuple[float, float, float]:
    """Redis CPU µs, this process's CPU µs and used_memory bytes per record of one pass."""
    probe = sync_redis.Redis.from_url(url)
    client = Redis.from_url(url)
    once = RunOnce(client, settings.names)
    binding = f"cost-{uuid.uuid4().hex[:6]}"
    memory0, cpu0 = probe.info("memory")["used_memory"], _cpu_s(probe)
    own0 = time.process_time()
    try:
        for start in range(0, n, batch):
            size = min(batch, n - start)
            items: list[Item] = [
                {"id": i, "binding": binding, "payload": b"{}", "key": None, "headers": [],
                 "attempt": 1, "source_ref": f"{binding}/{(start + i) % 4}/{(start + i) // 4}",
                 "record_time_ms": 0, "priority": 0, "deadline_ms": None}
                for i in range(size)]
            if fresh:
                left, write = once.run_fresh(binding, items)
                if left or write is None:
                    raise RuntimeError(f"{len(left)} fresh records could not be in a range")
                await write()
            else:
                codes = await once.claim(binding, items)
                if codes != RUN * size:
                    raise RuntimeError(f"new records were not all claimed: {codes[:20]}...")
            await once.finish(binding, items, [ok(i) if succeed else retry(i, "boom")
                                               for i in range(size)])
        return ((_cpu_s(probe) - cpu0) / n * 1e6, (time.process_time() - own0) / n * 1e6,
                (probe.info("memory")["used_memory"] - memory0) / n)
    finally:
        await once.close()
        await client.aclose()
        probe.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000)
    args = p.parse_args()
    settings = Settings.load(None)
    kinds = [(way, end) for way in ("claimed", "fresh") for end in ("success", "failure")]
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {k: [] for k in kinds}
    with services() as svc:
        for _ in range(args.rounds):
            for way, end in kinds:
                got[(way, end)].append(asyncio.run(
                    _run(svc.redis_url, settings, args.records, end == "success",
                         way == "fresh", args.batch)))
    for (way, end), rows in got.items():
        redis_cpu = statistics.median(c for c, _, _ in rows)
        own = statistics.median(o for _, o, _ in rows)
        memory = statistics.median(m for _, _, m in rows)
        print(f"{way} {end}: Redis CPU {redis_cpu:.2f} us/record, this process "
              f"{own:.2f} us/record, used_memory {memory:+.1f} bytes/record (median of "
              f"{len(rows)} passes of {args.records:,}, batches of {args.batch:,})")

if __name__ == "__main__":
    main()
