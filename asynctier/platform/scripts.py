"""The Lua scripts that keep the shared counters in Redis, read from ``lua/*.lua``.

Each script takes its time from Redis ``TIME`` (so processes' clocks never matter), does
O(1) work per item, and is registered once per Redis client (``register_script``: EVALSHA,
loaded again by itself after a Redis restart). Numbers are written back with
``string.format`` so that no precision is lost to Lua's ``tostring``. Each file's header
says what its KEYS and ARGV are and what it returns. The rooms that run a script name it
where they use it (admission in :mod:`asynctier.scheduler.limits.scripts`, membership,
the Submitter's enqueue capacity).
"""

from __future__ import annotations

from importlib import resources


def lua(*names: str, **constants: int) -> str:
    """The text of ``lua/<name>.lua`` for each of ``names``, joined in order, after one
    ``local NAME = value`` line per constant (values that Python code shares)."""
    folder = resources.files("asynctier.platform") / "lua"
    header = "".join(f"local {name} = {value}\n" for name, value in constants.items())
    return header + "".join((folder / f"{name}.lua").read_text() for name in names)
