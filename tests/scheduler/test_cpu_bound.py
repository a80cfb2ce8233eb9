"""A CPU-bound sync function leaves the scheduler's threads for worker processes, at its
tier's niceness; a function that waits on I/O, or one too quick to be worth a process,
stays in threads; ``cpu_bound_item_s=None`` keeps every binding in threads."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from prometheus_client import REGISTRY

from asynctier.platform.binding import NICENESS, Binding
from asynctier.platform.binding_features import Source
from asynctier.scheduler import SchedulerOptions
from tests.scheduler_harness import item, local_scheduler

FUNCTION = "tests.funcs.basic:spin"


def where_ran(out: Path) -> dict[int, tuple[int, int]]:
    """id -> (pid, niceness) of every item the function wrote down."""
    found = {}
    for line in out.read_text().splitlines():
        item_id, pid, nice = (int(v) for v in line.split())
        found[item_id] = (pid, nice)
    return found


def drain(bindings: list[Binding], out: Path, rounds: int, per_round: int,
          work: dict[str, dict[str, float]],
          options: SchedulerOptions | None = None) -> None:
    """``rounds`` batches of ``per_round`` items of every binding (``work[name]``: the
    function's payload), one round after the other (the first rounds measure the
    functions, the last run where they were put)."""
    async def scenario() -> None:
        scheduler = local_scheduler(bindings, options=options or SchedulerOptions(workers=4))
        scheduler.start()
        try:
            for r in range(rounds):
                batches = []
                for k, binding in enumerate(bindings):
                    start = (k * rounds + r) * per_round
                    batches.append([item(binding.name, i, json.dumps(
                        {"id": i, "out": str(out), **work.get(binding.name, {})}).encode())
                        for i in range(start, start + per_round)])
                results = await asyncio.gather(*(scheduler.process(b) for b in batches))
                assert all(o["status"] == "ok" for part in results for o in part), results
        finally:
            await scheduler.stop()

    asyncio.run(scenario())


def test_a_cpu_bound_function_moves_to_worker_processes_at_its_tiers_niceness(
        tmp_path: Path) -> None:
    out = tmp_path / "ran"
    crunch = Binding("crunch", Source("kafka", "t"), FUNCTION, priority="batch")
    waits = Binding("waits", Source("kafka", "t"), FUNCTION)  # I/O: 2 ms asleep, nearly no CPU
    drain([crunch, waits], out, rounds=8, per_round=400,
          work={"crunch": {"cpu_ms": 0.5}, "waits": {"sleep_ms": 2}})
    ran = where_ran(out)
    ours, our_nice = os.getpid(), os.nice(0)
    last_round = range(7 * 400, 8 * 400)
    assert {ran[i] for i in last_round} != {(ours, our_nice)}
    assert all(pid != ours and nice == our_nice + NICENESS["batch"]
               for pid, nice in (ran[i] for i in last_round)), "crunch still runs in threads"
    assert sum(1 for i in range(0, 400) if ran[i][0] == ours) == 400, \
        "crunch ran in processes before it was measured"
    waits_last = range(15 * 400, 16 * 400)
    assert {ran[i] for i in waits_last} == {(ours, our_nice)}, "an I/O function moved"
    assert REGISTRY.get_sample_value("asynctier_binding_in_processes",
                                     {"binding": "crunch"}) == 1


def test_quick_functions_stay_in_threads_and_the_switch_turns_it_off(tmp_path: Path) -> None:
    out = tmp_path / "ran"
    quick = Binding("quick", Source("kafka", "t"), FUNCTION)  # all CPU, a few microseconds an item
    crunch = Binding("crunch-off", Source("kafka", "t"), FUNCTION)
    drain([quick, crunch], out, rounds=6, per_round=400,
          options=SchedulerOptions(workers=4, cpu_bound_item_s=None),
          work={"crunch-off": {"cpu_ms": 0.5}, "quick": {}})
    ran = where_ran(out)
    assert {pid for pid, _ in ran.values()} == {os.getpid()}


def test_a_run_longer_than_the_window_is_judged_alone(tmp_path: Path) -> None:
    out = tmp_path / "ran"
    slow = Binding("slow", Source("kafka", "t"), FUNCTION)
    drain([slow], out, rounds=2, per_round=1, work={"slow": {"sleep_ms": 1100}})
    assert {pid for pid, _ in where_ran(out).values()} == {os.getpid()}
