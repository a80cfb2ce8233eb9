"""`asynctier produce TOPIC < records.jsonl`: every line a record, delivery confirmed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from asynctier.platform.config import Settings
from tests.platform_harness import Platform, read_topic


def test_produce_reads_json_lines_with_keys(settings: Settings, tmp_path: Path,
                                            unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(2)
    lines = [json.dumps({"id": i, "key": f"user-{i % 3}"}) for i in range(50)]
    lines.insert(10, "")  # blank lines are skipped
    done = Platform(settings, tmp_path).cli("produce", topic, input="\n".join(lines) + "\n")
    assert "produced 50 record(s)" in done.stderr
    records: list = read_topic(settings, topic)
    assert len(records) == 50
    assert {json.loads(m.value())["id"] for m in records} == set(range(50))
    assert {m.key() for m in records} == {b"user-0", b"user-1", b"user-2"}


def test_produce_stops_at_a_line_that_is_not_json(settings: Settings, tmp_path: Path,
                                                  unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    text = '{"id": 1}\n{"id": 2}\nnot json\n{"id": 4}\n'
    done = Platform(settings, tmp_path).cli("produce", topic, input=text, check=False)
    assert done.returncode == 2
    assert "line 3 is not JSON" in done.stderr and "2 record(s) before it" in done.stderr
    assert len(read_topic(settings, topic)) == 2
