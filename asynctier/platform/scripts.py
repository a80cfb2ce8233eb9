"""The Lua scripts that keep the shared counters in Redis, read from ``lua/*.lua``.

Each script takes its time from Redis ``TIME`` through ``clock.lua``, which every script
starts with (so processes' clocks never matter; some take an optional time argument
instead, a clock tests move), does O(1) work per item, and
is registered once per Redis client (``register_script``: EVALSHA, loaded again by itself
after a Redis restart). Numbers are written back with ``string.format`` so that no
precision is lost to Lua's ``tostring``. Each file's header says what its KEYS and ARGV
are and what it returns; a file that defines a function (``charge_quota.lua``,
``take_tokens.lua``) is joined with one that calls it, alone or with another
(``quota_and_tokens.lua``). The rooms that run a script name it where they use it
(admission in :mod:`asynctier.scheduler.limits.scripts`, membership, the Submitter's
enqueue capacity). The admission's and the run-once scripts check each value they read
from Redis and answer what they refused beside their result.
"""

from __future__ import annotations

from importlib import resources


def lua(*names: str, **constants: int) -> str:
    """The text of ``lua/<name>.lua`` for each of ``names``, joined in order, after one
    ``local NAME = value`` line per constant (values that Python code shares) and
    ``clock.lua`` (``redis_now_ms()`` and ``redis_now_us()``: Redis TIME)."""
    folder = resources.files("asynctier.platform") / "lua"
    header = "".join(f"local {name} = {value}\n" for name, value in constants.items())
    return header + "".join((folder / f"{name}.lua").read_text()
                            for name in ("clock", *names))
