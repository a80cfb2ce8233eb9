"""Circuit breakers per binding (``--breaker 50%/30s``), shared by every scheduler in Redis.

When a binding's failure share over its window crosses the threshold, its breaker
**opens**: new records are *parked* (a retry that spends no attempt, after ``park_s``)
instead of burning their ladder against a dead downstream, and one probe record per
``probe_interval_s`` (across all schedulers) runs. A probe that fails spends no attempt
either. When a probe succeeds the breaker **ramps**: the share of each batch let through
grows from 0 to 1 over ``ramp_s``, then it is **closed**. A failure share over the
threshold while ramping opens it again.

The state lives in one Redis hash per binding (``lua/breaker.lua``: one round trip per
batch admitted and per chunk reported); the scheduler whose call changed the state logs
the change, so each change is logged once. Each scheduler keeps the last state it saw to
park chunks already queued when the breaker opens. Redis down: the breaker stays as last
seen here, and a closed one lets everything through.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.names import Names
from asynctier.platform.redis_client import REDIS_DOWN, AsyncRedis, async_client
from asynctier.platform.wire import DECODE_REASONS, EXPIRED, TOO_LARGE, Item, Outcome, retry
from asynctier.scheduler.limits.bad_values import BadValues
from asynctier.scheduler.limits.quota import as_text
from asynctier.scheduler.limits.scripts import BREAKER

log = logging.getLogger(__name__)

CLOSED, OPEN, RAMP = "closed", "open", "ramp"
#: The gauge's value of each state (``asynctier_breaker_state``).
STATE_VALUES = {CLOSED: 0, RAMP: 1, OPEN: 2}

#: Failures that say nothing of the downstream's health: not counted.
NOT_HEALTH = DECODE_REASONS | {EXPIRED, TOO_LARGE}

#: How long a breaker's Redis call may take before its state is kept as last seen.
SOCKET_TIMEOUT_S = 2.0

_SPEC_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*/\s*(\S+)\s*$")


def parse_breaker(text: str) -> tuple[float, float]:
    """``50%/30s`` as (0.5, 30.0); ValueError saying what to write otherwise."""
    from asynctier.platform.durations import parse_duration

    match = _SPEC_RE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a breaker: write SHARE%/WINDOW, such as 50%/30s")
    return float(match.group(1)) / 100.0, parse_duration(match.group(2))


@dataclass(frozen=True)
class BreakerConfig:
    """How breakers behave once open: probes, parking, ramp, the least evidence to open."""

    probe_interval_s: float = 1.0
    park_s: float = 5.0
    ramp_s: float = 10.0
    min_calls: int = 20


@dataclass
class _Seen:
    state: str = CLOSED
    at: float = 0.0


class Breakers:
    """Every binding's breaker, on one Redis client (created here unless given)."""

    def __init__(self, client: AsyncRedis, names: Names, config: BreakerConfig | None = None,
                 own_client: bool = False, clock: Callable[[], int] | None = None) -> None:
        self.client = client
        self._clock = clock  # epoch ms, a clock tests move; Redis TIME when None
        self._bad = BadValues(log)
        self.names = names
        self.config = config or BreakerConfig()
        self._own = own_client
        self._script = client.register_script(BREAKER)
        self._seen: dict[str, _Seen] = {}
        self._probes: set[int] = set()  # id() of the probe items under way here

    @classmethod
    def from_settings(cls, settings: Settings,
                      config: BreakerConfig | None = None) -> Breakers:
        """Breakers on a new client of ``settings.redis_url``."""
        client = async_client(settings.redis_url, socket_timeout=SOCKET_TIMEOUT_S,
                              socket_connect_timeout=SOCKET_TIMEOUT_S)
        return cls(client, settings.names, config, own_client=True)

    def key(self, binding: str) -> str:
        """The Redis hash of ``binding``'s breaker."""
        return self.names.redis_key("breaker", binding)

    def state(self, binding: str) -> str:
        """The state this scheduler saw last."""
        seen = self._seen.get(binding)
        return CLOSED if seen is None else seen.state

    async def admit(self, binding: Binding,
                    items: list[Item]) -> tuple[list[Outcome], list[Item]]:
        """(parked outcomes, items let through) for a batch of ``binding``."""
        if binding.breaker.ratio is None or not items:
            return [], items
        answer = await self._call(binding, "admit", len(items))
        if answer is None:
            return [], items
        let, probing = answer
        admitted, held = items[:let], items[let:]
        if probing:
            self._probes.update(id(i) for i in admitted)
            metrics.count_breaker_probes(binding.name, len(admitted))
        return self.park(binding, held), admitted

    def parks_now(self, binding: Binding) -> bool:
        """Whether chunks of ``binding`` leaving the queue now should be parked."""
        return binding.breaker.ratio is not None and self.state(binding.name) == OPEN

    def is_probe(self, item: Item) -> bool:
        """Whether ``item`` was let through as a probe."""
        return id(item) in self._probes

    def park(self, binding: Binding, items: Sequence[Item]) -> list[Outcome]:
        """Parked outcomes of ``items``: back in ``park_s``, no attempt spent."""
        if not items:
            return []
        metrics.count_breaker_parked(binding.name, len(items))
        why = (f"parked: binding {binding.name}'s breaker is {self.state(binding.name)} "
               "(its downstream fails); no attempt spent")
        return [retry(i["id"], why, after_s=self.config.park_s, spends_attempt=False)
                for i in items]

    async def report(self, binding: Binding, items: Sequence[Item],
                     outcomes: Sequence[Outcome]) -> list[Outcome]:
        """Feed the breaker a chunk's outcomes (bad input does not count); the outcomes with
        failed probes turned into retries that spend no attempt."""
        if binding.breaker.ratio is None or not outcomes:
            return list(outcomes)
        probe_ids = {i["id"] for i in items if id(i) in self._probes}
        for item in items:
            self._probes.discard(id(item))
        counts = [0, 0, 0, 0]  # ok, bad, probes ok, probes bad
        result = []
        for o in outcomes:
            good = o["status"] == "ok"
            probe = o["id"] in probe_ids
            if good or (o["spends_attempt"] and o["reason"] not in NOT_HEALTH):
                counts[(2 if probe else 0) + (0 if good else 1)] += 1
            if probe and not good and o["status"] == "retry":
                o = {**o, "spends_attempt": False}
            result.append(o)
        await self._call(binding, "report", *counts)
        return result

    async def _call(self, binding: Binding, op: str, *args: int) -> tuple[int, int] | None:
        cfg = self.config
        assert binding.breaker.ratio is not None
        try:
            raw = await self._script(keys=[self.key(binding.name)], args=[
                op, binding.breaker.ratio, int(binding.breaker.window_s * 1000),
                cfg.min_calls, int(cfg.probe_interval_s * 1000), int(cfg.ramp_s * 1000),
                *args, *([0] * (4 - len(args))),
                *([] if self._clock is None else [self._clock()])])
        except REDIS_DOWN as exc:
            log.warning("binding %s: the breaker's state cannot be read from Redis (%s); "
                        "it stays %s here", binding.name, exc, self.state(binding.name))
            return None
        state = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
        self._refused(binding, as_text(raw[4]))
        self._note(binding, state, bool(int(raw[2])))
        return int(raw[1]), int(raw[3])

    def _refused(self, binding: Binding, refused: str) -> None:
        """Say once each value of the breaker's hash the script refused (it started the
        breaker afresh, closed)."""
        key = self.key(binding.name)
        if not refused:
            self._bad.good(key)
            return
        self._bad.refused(key, "", refused.replace("\n", ", "),
                          "not a breaker's state (closed, open or ramp), count or time; the "
                          "breaker started afresh, closed, and the hash was written anew",
                          "nothing to do (to reset a breaker by hand, delete the key)",
                          binding=binding.name)

    def _note(self, binding: Binding, state: str, changed_here: bool) -> None:
        seen = self._seen.setdefault(binding.name, _Seen())
        seen.state, seen.at = state, time.monotonic()
        metrics.set_breaker_state(binding.name, STATE_VALUES.get(state, 0))
        if changed_here:
            log.warning("binding %s: breaker %s (%s)", binding.name, state.upper(),
                        _meaning(binding, state, self.config), extra={"binding": binding.name})

    async def close(self) -> None:
        """Close the Redis client when it was created here."""
        if self._own:
            await self.client.aclose()


def _meaning(binding: Binding, state: str, cfg: BreakerConfig) -> str:
    if state == OPEN:
        return (f"at least {binding.breaker.ratio:.0%} of its calls failed over "
                f"{binding.breaker.window_s:g}s: new records are parked for {cfg.park_s:g}s "
                f"without spending attempts; one probe every {cfg.probe_interval_s:g}s")
    if state == RAMP:
        return f"a probe succeeded: records flow back over {cfg.ramp_s:g}s"
    return "records flow as usual"


async def read_states(client: AsyncRedis, names: Names,
                      bindings: Sequence[str]) -> dict[str, str]:
    """The shared state of each binding's breaker (``closed`` when it has none yet)."""
    out: dict[str, str] = {}
    for name in bindings:
        raw = await client.hget(names.redis_key("breaker", name), "state")
        out[name] = raw.decode() if isinstance(raw, bytes) else (raw or CLOSED)
    return out
