"""The collector policy of a component process (run in a child process: it would change
pytest's own collector): what was alive at start is frozen, collections are spaced out,
and a reference cycle made afterwards is still collected."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from asynctier.cli.gcpolicy import GEN0, quiet_gc
before = gc.get_freeze_count()
quiet_gc()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                  "threshold": gc.get_threshold(), "gen0": GEN0,
                  "cycle_collected": gone() is None}))
"""


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60)
    got = json.loads(out.stdout)
    assert got["before"] == 0 and got["frozen"] > 1000  # the modules loaded at start
    assert got["threshold"][0] == got["gen0"] > 700  # CPython's default is 700
    assert got["cycle_collected"]
