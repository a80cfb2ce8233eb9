"""Per-key order is a strategy around any offset source (pure logic: a list of Kafka
records as the source, parked keys in memory): one record per key under way, the next let
go once its batch is handed off, commits kept below the records held back, and a partition
gone forgotten. Also: the tailers have no import circle, and the Kafka source has no
ordering branch."""

from __future__ import annotations

import ast
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from asynctier.platform import wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.calls import CallBuilder
from asynctier.platform.supervise import Supervisor
from asynctier.tailers.key_order import Keyed, KeyOrder
from asynctier.tailers.ordered import KeyGate
from asynctier.tailers.source import TP, Batch, Offsets, OffsetSource, Prepared, high_marks

BINDING = Binding("orders", Source("kafka", "t"), "tests.funcs.ledger:record",
                  execution=Execution(ordering="key"))
TAILERS = Path(__file__).resolve().parents[2] / "asynctier" / "tailers"


def _msg(offset: int, key: bytes | None, partition: int = 0) -> Message:
    return Message(topic="t", partition=partition, offset=offset, key=key, value=b"{}",
                   headers=None, timestamp=(1, 1_700_000_000_000))


class MemoryLot:
    """Parked keys in memory: none parked, so the gate never asks more."""

    def __init__(self) -> None:
        self.parked: list[Sequence[tuple[str, str]]] = []

    def parked_view(self, limit: int) -> dict[str, str]:
        return {}

    def park(self, heads: Sequence[tuple[str, str]]) -> None:
        self.parked.append(heads)

    def unpark(self, heads: Sequence[tuple[str, str]]) -> None:
        """Nothing parked: nothing to do."""


class ListOffsets:
    """An offset source over a list of Kafka records that records its commits and holds."""

    what = "list of records (test)"
    topic = "t"

    def __init__(self, records: list[Message]) -> None:
        self.binding = BINDING
        self.handoff: Any = None  # never asked: every outcome of these tests is ok
        self.unread = list(records)
        self.owned: set[TP] = {("t", 0), ("t", 1)}
        self.stats: Counter[str] = Counter()
        self.commits: list[Offsets] = []
        self.forget: list[Callable[[set[TP]], None]] = []

    def read(self, max_records: int, wait_s: float) -> list[Any]:
        got, self.unread = self.unread[:max_records], self.unread[max_records:]
        return got

    def prepare(self, records: list[Any]) -> Prepared[None]:
        call = CallBuilder()
        for msg in records:
            call.add(BINDING.name, msg.value(), msg.key(), None, 1,
                     f"t/{msg.partition()}/{msg.offset()}", 0)
        return Prepared(records, call.encode() if records else None, None,
                        high_marks(records))

    def wait(self, batch: Batch[Any], superseded: Callable[[], bool]) -> bool:
        return True

    def hand_off(self, batch: Batch[None]) -> Counter[str]:
        return Counter(ok=len(batch.records))

    def confirm(self) -> None:
        """Nothing written."""

    def checkpoint(self, batch: Batch[Any], sync: bool) -> None:
        self.commit(batch.mark, sync)

    def checkpoint_final(self, scope: set[TP] | None) -> None:
        """Every commit landed."""

    def counted(self, batch: Batch[Any]) -> None:
        self.stats.update(batch.counts)

    def commit(self, mark: Offsets, sync: bool) -> None:
        self.commits.append(dict(mark))

    def hold(self, pause: Sequence[TP], resume: Sequence[TP]) -> None:
        """Nothing deep enough to pause in these tests."""

    def on_gone(self, forget: Callable[[set[TP]], None]) -> None:
        self.forget.append(forget)

    def beside(self, stop: threading.Event) -> list[Supervisor]:
        return []


def _ordered(records: list[Message]) -> tuple[KeyOrder, ListOffsets]:
    source = ListOffsets(records)
    typed: OffsetSource[None] = source  # it is one: the strategy wraps any of them
    gate = KeyGate(BINDING, MemoryLot(), batch_size=10)  # type: ignore[arg-type]
    return KeyOrder(typed, gate), source


def _sent(order: KeyOrder, records: list[Any]) -> Batch[Keyed]:
    """``records`` prepared, sent, and answered all ok."""
    prepared = order.prepare(records)
    batch = Batch(prepared.records, None, prepared.items or 0, prepared.mark,
                  prepared.extra)
    batch.outcomes = [wire.ok(i) for i in range(batch.items)]
    return batch


def _offsets(records: list[Any]) -> list[int]:
    return [m.offset() for m in records]


def test_key_order_wraps_any_offset_source() -> None:
    order, source = _ordered([_msg(0, b"a"), _msg(1, b"a"), _msg(2, b"b")])
    first = order.read(10, 0)
    assert _offsets(first) == [0, 2]  # a's second record waits behind its first
    batch = _sent(order, first)
    assert order.read(10, 0) == []  # nothing let go until the batch is handed off
    assert order.hand_off(batch)["ok"] == 2
    order.checkpoint(batch, sync=True)
    assert source.commits == [{("t", 0): 0}]  # not past offset 1, still held back
    second = order.read(10, 0)
    assert _offsets(second) == [1]
    again = _sent(order, second)
    order.hand_off(again)
    order.checkpoint(again, sync=True)
    assert source.commits[-1] == {("t", 0): 2}  # all resolved: past the highest


def test_a_hand_off_tried_again_lets_a_key_go_once() -> None:
    order, _ = _ordered([_msg(0, b"a"), _msg(1, b"a"), _msg(2, b"a")])
    batch = _sent(order, order.read(10, 0))
    order.hand_off(batch)
    order.hand_off(batch)  # the pipeline writes a refused hand-off again
    assert _offsets(order.read(10, 0)) == [1]  # one record of the key, not two


def test_a_partition_gone_is_forgotten_by_the_strategy() -> None:
    order, source = _ordered([_msg(0, b"a", 1), _msg(1, b"a", 1), _msg(5, b"c", 0)])
    assert _offsets(order.read(10, 0)) == [0, 5]
    assert order.gate.held == 1
    for forget in source.forget:  # what the source's revoke or loss tells the strategy
        forget({("t", 1)})
    assert order.gate.held == 0 and ("t", 1) not in order.gate.open


def _imports(path: Path) -> set[str]:
    """The asynctier.tailers modules ``path`` imports, at its top or in a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "asynctier.tailers."):
            found.add(str(node.module).rsplit(".", 1)[1])
    return found


def test_the_tailers_import_no_circle() -> None:
    graph = {p.stem: _imports(p) for p in TAILERS.glob("*.py")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert [name for name in graph if reaches(name, name, set())] == []


def test_the_kafka_source_has_no_ordering_branch() -> None:
    text = (TAILERS / "kafka.py").read_text()
    assert "gate" not in text and 'ordering == "key"' not in text
