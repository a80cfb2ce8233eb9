"""The breaker on real processes: a downstream down for 20 s, 5,000 records, 3 attempts.

Long (``--long``): each run lasts the outage, the ramp and the parked records' return.
With ``--breaker`` no record is a dead letter because of the outage and all run after it;
without, many are dead letters. The probe rate while open stays under its cap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asynctier.platform.config import Settings
from tests.funcs.breaker import calls
from tests.helpers import wait_until
from tests.platform_harness import Platform, produce_json

N = 5000
OUTAGE_S = 20.0
PROBE_INTERVAL_S = 1.0  # BreakerConfig's default


@pytest.fixture
def platform(settings: Settings, tmp_path: Path) -> Iterator[Platform]:
    """The test's platform processes; stopped at the end."""
    plat = Platform(settings, tmp_path, allow=("tests.funcs.breaker",),
                    env={"ASYNCTIER_TEST_OUTAGE": str(tmp_path / "outage")})
    yield plat
    plat.stop_all()


def _dead(platform: Platform) -> int:
    rows = json.loads(platform.cli("dlq", "list", "pay", "--json").stdout or "[]")
    return len(rows)


@pytest.mark.slow
@pytest.mark.parametrize("breaker", [True, False], ids=["breaker", "no-breaker"])
def test_an_outage_burns_no_attempts_behind_a_breaker(
        platform: Platform, unique_topic: Callable[..., str], settings: Settings,
        tmp_path: Path, breaker: bool) -> None:
    topic = unique_topic(4)
    extra = ["--breaker", "50%/10s"] if breaker else []
    platform.cli("bind", "pay", "--topic", topic, "--function", "tests.funcs.breaker:flaky",
                 "--max-attempts", "3", "--retry-ladder", "1s,2s", *extra)
    platform.start("scheduler")
    platform.start("tailers")
    platform.start("delay")
    wait_until(lambda: ": assigned " in platform.log("tailers", 100_000), 60, "tailers ready")
    until = time.time() + OUTAGE_S
    (tmp_path / "outage").write_text(f"{until:.6f}")
    produce_json(settings, topic, [{"id": i} for i in range(N)], key_of="id")

    def settled() -> bool:
        done = {c.id for c in calls(platform.ledger) if c.ok}
        return len(done) + (_dead(platform) if not breaker else 0) >= N
    wait_until(settled, 300, "every record ran or is a dead letter", interval=1.0)
    got = calls(platform.ledger)
    dead = _dead(platform)
    ran_ok = {c.id for c in got if c.ok}
    first = min(c.at for c in got)
    # while open: the calls from 3 s after the first failure to the end of the outage
    during = [c for c in got if first + 3.0 <= c.at < until]
    span = until - first - 3.0
    print(f"\n{'with' if breaker else 'without'} breaker: {dead} dead letter(s), "
          f"{len(ran_ok)} of {N} ran ok, {len(got)} calls; {len(during)} calls in the "
          f"{span:.0f}s of outage after the first 3s ({len(during) / span:.2f}/s)")
    if breaker:
        assert dead == 0
        assert ran_ok == set(range(N))
        assert len(during) <= span / PROBE_INTERVAL_S + 2  # probes stayed under the cap
        assert "breaker OPEN" in platform.log("scheduler", 1_000_000)
    else:
        assert dead >= N // 2  # the outage burnt their ladders
