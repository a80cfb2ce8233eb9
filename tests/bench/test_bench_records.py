"""The benchmark's records: the open-loop producer's fast path writes exactly the JSON the
general path writes (the same bytes, about 100 of them)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from bench.records import RECORD_BYTES, record


@given(st.integers(min_value=0, max_value=10**9),
       st.floats(min_value=1.6e9, max_value=2.2e9, allow_nan=False))
def test_fast_record_is_the_json_record(i: int, t0: float) -> None:
    fast = record(i, t0)
    general = record(i, t0, pad="")  # any extra field takes the json.dumps path
    doc = json.loads(fast)
    assert doc["id"] == i and doc["t0"] == round(t0, 6)
    assert len(fast) == RECORD_BYTES
    assert json.loads(general) == {"id": i, "t0": round(t0, 6), "pad": doc["pad"]}
    assert len(general) == len(fast)
