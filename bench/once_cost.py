"""What the run-once guard costs Redis: CPU and memory per record.

    python -m bench.once_cost [--records 100000] [--rounds 3] [--batch 1000]

Claims and finishes ``--records`` records (batches of ``--batch`` records of 4 partitions
of one topic, as a tailer reads them) with :class:`RunOnce`, once all succeeding and once
all failing, ``--rounds`` times, and prints the medians: Redis' own CPU (``INFO cpu``) and
the growth of its ``used_memory`` per record. A drain sends batches of 1,000; at half
load, of about 300. The successes stay in Redis for the run-once
window, which is what the memory figure is about; failures leave nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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


async def _run(url: str, settings: Settings, n: int, succeed: bool,
               batch: int) -> tuple[float, float]:
    """Redis CPU µs and used_memory bytes per record of one pass."""
    probe = sync_redis.Redis.from_url(url)
    client = Redis.from_url(url)
    once = RunOnce(client, settings.names)
    binding = f"cost-{uuid.uuid4().hex[:6]}"
    memory0, cpu0 = probe.info("memory")["used_memory"], _cpu_s(probe)
    try:
        for start in range(0, n, batch):
            size = min(batch, n - start)
            items: list[Item] = [
                {"id": i, "binding": binding, "payload": b"{}", "key": None, "headers": [],
                 "attempt": 1, "source_ref": f"{binding}/{(start + i) % 4}/{(start + i) // 4}",
                 "record_time_ms": 0, "priority": 0, "deadline_ms": None}
                for i in range(size)]
            codes = await once.claim(binding, items)
            if codes != RUN * size:
                raise RuntimeError(f"fresh records were not all claimed: {codes[:20]}...")
            await once.finish(binding, items, [ok(i) if succeed else retry(i, "boom")
                                               for i in range(size)])
        return ((_cpu_s(probe) - cpu0) / n * 1e6,
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
    got: dict[str, list[tuple[float, float]]] = {"success": [], "failure": []}
    with services() as svc:
        for _ in range(args.rounds):
            for kind in got:
                got[kind].append(asyncio.run(
                    _run(svc.redis_url, settings, args.records, kind == "success",
                         args.batch)))
    for kind, rows in got.items():
        cpu = statistics.median(c for c, _ in rows)
        memory = statistics.median(m for _, m in rows)
        print(f"{kind}: Redis CPU {cpu:.2f} us/record, used_memory {memory:+.1f} bytes/record "
              f"(median of {len(rows)} passes of {args.records:,}, batches of {args.batch:,})")


if __name__ == "__main__":
    main()
