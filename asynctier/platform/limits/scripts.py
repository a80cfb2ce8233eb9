"""The Lua scripts that keep the shared counters, read once from ``lua/*.lua``.

Each script takes its time from Redis ``TIME`` (so schedulers' clocks never matter), does
O(1) work per item, and is registered once per Redis client (``register_script``: EVALSHA,
loaded again by itself after a Redis restart). Numbers are written back with
``string.format`` so that no precision is lost to Lua's ``tostring``. Each file's header
says what its KEYS and ARGV are and what it returns.
"""

from __future__ import annotations

from importlib import resources
from typing import Final


def lua(*names: str, **constants: int) -> str:
    """The text of ``lua/<name>.lua`` for each of ``names``, joined in order, after one
    ``local NAME = value`` line per constant (values that Python code shares)."""
    folder = resources.files("asynctier.platform.limits") / "lua"
    header = "".join(f"local {name} = {value}\n" for name, value in constants.items())
    return header + "".join((folder / f"{name}.lua").read_text() for name in names)


#: A token bucket that hands out reservations (``lua/take_tokens.lua``).
TAKE_TOKENS: Final = lua("take_tokens")
#: Charge a tenant for a chunk against its quotas (``lua/charge_quota.lua``).
CHARGE_QUOTA: Final = lua("charge_quota")
#: Take workloads of a tenant's enqueue capacity (``lua/take_enqueue_capacity.lua``).
TAKE_ENQUEUE_CAPACITY: Final = lua("take_enqueue_capacity")
#: Take one concurrency lease below the cap (``lua/acquire_lease.lua``).
ACQUIRE_LEASE: Final = lua("acquire_lease")
#: Extend the concurrency leases a holder still has (``lua/renew_leases.lua``).
RENEW_LEASES: Final = lua("renew_leases")
#: A binding's circuit breaker: admit records or report outcomes (``lua/breaker.lua``).
BREAKER: Final = lua("breaker")
