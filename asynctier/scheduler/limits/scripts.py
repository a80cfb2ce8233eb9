"""The admission scripts (:mod:`asynctier.platform.scripts` says how they are written)."""

from __future__ import annotations

from typing import Final

from asynctier.platform.scripts import lua

#: A token bucket that hands out reservations (``lua/take_tokens.lua``).
TAKE_TOKENS: Final = lua("take_tokens", "take_tokens_call")
#: Charge a tenant for a chunk against its quotas (``lua/charge_quota.lua``).
CHARGE_QUOTA: Final = lua("charge_quota", "charge_quota_call")
#: Both in one call, on one Redis server (``lua/quota_and_tokens.lua``): the tokens of
#: what the quota admitted are taken with it.
QUOTA_AND_TOKENS: Final = lua("charge_quota", "take_tokens", "quota_and_tokens")
#: Take one concurrency lease below the cap (``lua/acquire_lease.lua``).
ACQUIRE_LEASE: Final = lua("acquire_lease")
#: Extend the concurrency leases a holder still has (``lua/renew_leases.lua``).
RENEW_LEASES: Final = lua("renew_leases")
#: A binding's circuit breaker: admit records or report outcomes (``lua/breaker.lua``).
BREAKER: Final = lua("breaker")
