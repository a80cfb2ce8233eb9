"""``Handoff.resolve_messages`` (a batch at once, with the retry-flood fast path) writes the
same records, headers and counts as ``Handoff.resolve`` on each record (pure logic: the
producer is a recorder; the real hand-off is proven by the delay and fault suites)."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier.delay_streams import handoff as handoff_module
from asynctier.delay_streams.handoff import Handoff, parcel_from_message, unpack_delay
from asynctier.platform import names as n
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import HandoffError
from asynctier.platform.wire import Outcome, failed, ok, retry


class _Recorder:
    """Stands for ConfirmingProducer: ``produce`` is its careful path, ``client_produce``
    the Kafka client's own call, which refuses when ``full`` (a full queue); every topic
    has ``partitions`` partitions (None: the broker could not tell)."""

    def __init__(self, full: bool = False, partitions: int | None = 8) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, list[Any]]] = []
        self.full = full
        self.careful = 0
        self.partitions = partitions
        self.lookups = 0
        self.used: list[tuple[str, int]] = []  # (topic, partition) of each record
        self.fail_next_confirm = False

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[Any] | None = None, timestamp_ms: int = 0,
                partition: int = -1) -> None:
        self.careful += 1
        self.records.append((topic, value, key, list(headers or [])))
        self.used.append((topic, partition))

    def client_produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                       partition: int = -1, callback: Any = None, on_delivery: Any = None,
                       timestamp: int = 0, headers: list[Any] | None = None) -> None:
        """confluent_kafka.Producer.produce's arguments, in its order: the producer's own
        delivery callback and the time now."""
        assert (callback, on_delivery, timestamp) == (None, None, 0)
        if self.full:
            raise BufferError("Local: Queue full")
        self.records.append((topic, value, key, list(headers or [])))
        self.used.append((topic, partition))

    def partition_count(self, topic: str, timeout_s: float = 2.0) -> int | None:
        self.lookups += 1
        return self.partitions

    def confirm(self, timeout_s: float = 30.0) -> None:
        if self.fail_next_confirm:
            self.fail_next_confirm = False
            raise HandoffError("1 delivery failure(s): Local: Unknown partition")


class _Msg:
    def __init__(self, offset: int, headers: list[tuple[str, bytes | None]] | None,
                 pad: int = 0) -> None:
        self._offset = offset
        self._headers = headers
        self._pad = pad

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return self._offset % 3

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b'{"n": %d, "pad": "%s"}' % (self._offset, b"x" * self._pad)

    def key(self) -> bytes | None:
        return None if self._offset % 2 else b"k%d" % self._offset

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_699_999_000_000 + self._offset)  # TIMESTAMP_CREATE_TIME


HEADERS = st.one_of(
    st.none(),
    st.just([("trace", b"abc")]),
    st.just([(n.H_ATTEMPT, b"3"), (n.H_ORIGIN, b"orders/1/9"), (n.H_FIRST_SEEN, b"1000")]),
)
OUTCOME = st.sampled_from(["ok", "retry", "retry-after", "held", "failed", "retry-other"])
#: Value sizes around the (patched, see LIMITS) delay topic limit: small, fits with the
#: platform's headers (12 kB), fits alone but not with them (14 kB), over it (30 kB).
PAD = st.sampled_from([0, 0, 0, 12_000, 14_000, 30_000])
#: A delay topic's limit made small (20 kB), so that the records here cross it.
LIMITS = {"MAX_MESSAGE_BYTES": 20_000, "FAST_MAX_BYTES": 10_000}


def _outcome(kind: str, i: int) -> Outcome:
    return {
        "ok": lambda: ok(i),
        "retry": lambda: retry(i, "RuntimeError: boom"),
        "retry-other": lambda: retry(i, "ValueError: other"),
        "retry-after": lambda: retry(i, "later", after_s=7.0),
        "held": lambda: retry(i, "over quota", after_s=2.5, spends_attempt=False),
        "failed": lambda: failed(i, "rejected: no"),
    }[kind]()


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(HEADERS, OUTCOME, PAD), min_size=1, max_size=30),
       max_attempts=st.sampled_from([1, 2, 5]), with_origins=st.booleans(),
       full=st.booleans(), with_size=st.booleans(),
       delay_headers=st.sampled_from(["packed", "separate"]))
def test_the_batch_path_writes_what_the_record_path_writes(
        rows: list[tuple[Any, str, int]], max_attempts: int, with_origins: bool,
        full: bool, with_size: bool, delay_headers: str) -> None:
    """Whether the caller passes the origins (and the batch's size) or not, whether the
    client's queue takes the fast path's records or not (then the careful path writes
    them), whatever the records' sizes against a delay topic's limit, and however the
    delay records carry their headers."""
    with mock.patch.object(handoff_module.time, "time", lambda: 1_700_000_000.0), \
            mock.patch.multiple(handoff_module, **LIMITS):
        _compare(rows, max_attempts, with_origins, full, with_size,
                 Settings(delay_headers=delay_headers))


def test_a_delay_record_carries_its_headers_packed_or_one_by_one() -> None:
    """Packed (the default): one ``asynctier.delay`` header after the record's own, read
    back as the six; ``separate``: the six, as a version before packing reads them."""
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0,), max_attempts=3))
    written = {}
    for form in ("packed", "separate"):
        recorder = _Recorder()
        handoff = Handoff(Settings(delay_headers=form), producer=recorder)  # type: ignore[arg-type]
        with mock.patch.object(handoff_module.time, "time", lambda: 1_700_000_000.0):
            handoff.resolve_messages(binding, [_Msg(0, None), _Msg(1, [("trace", b"t")])],
                                     [retry(0, "boom"), retry(1, "boom")])
        written[form] = [headers for _, _, _, headers in recorder.records]
    for headers in written["packed"]:
        assert [name for name, _ in headers if name.startswith("asynctier.")] == [n.H_DELAY]
    for headers in written["separate"]:
        assert n.H_DELAY not in dict(headers)
    for packed, separate in zip(written["packed"], written["separate"], strict=True):
        unpacked = {**dict(packed[:-1]), **unpack_delay(packed[-1][1])}
        assert unpacked == dict(separate)


def test_a_failing_record_too_large_for_a_delay_topic_is_a_dead_letter_kept_whole() -> None:
    """Not retried (a delay topic would refuse it at every try, and the binding would wait
    behind it): written whole to the dead-letter topic, reason ``too_large``, with the
    function's error; the small records of the same batch go to the delay topic."""
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0,)))
    messages = [_Msg(0, None), _Msg(1, None, pad=30_000), _Msg(2, [("trace", b"t")], 30_000)]
    outcomes = [retry(i, "RuntimeError: boom") for i in range(3)]
    recorder = _Recorder()
    handoff = Handoff(Settings(), producer=recorder)  # type: ignore[arg-type]
    with mock.patch.multiple(handoff_module, **LIMITS):
        counts = handoff.resolve_messages(binding, messages, outcomes,
                                          batch_bytes=sum(len(m.value()) for m in messages))
    assert dict(counts) == {"retry": 1, "dead_letter": 2}
    by_value = {value: (topic, dict(headers)) for topic, value, _, headers in recorder.records}
    topic, headers = by_value[messages[0].value()]
    assert topic == Settings().names.delay_topic("1s")
    for big in messages[1:]:
        topic, headers = by_value[big.value()]  # the whole value
        assert topic == Settings().names.dlq_topic("b")
        assert headers[n.H_REASON] == b"too_large"
        error = headers[n.H_ERROR].decode()
        assert error.startswith("RuntimeError: boom (not retried: the record's "), error
        assert headers[n.H_ATTEMPTS_MADE] == b"1"
    assert dict(recorder.records[-1][3])["trace"] == b"t"  # its own headers kept
    assert handoff._dead == {("b", "too_large"): 2}


def _compare(rows: list[tuple[Any, str, int]], max_attempts: int, with_origins: bool = False,
             full: bool = False, with_size: bool = False,
             config: Settings | None = None) -> None:
    config = config or Settings()
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0, 2.0, 4.0), max_attempts=max_attempts))
    messages = [_Msg(i, headers, pad) for i, (headers, _, pad) in enumerate(rows)]
    outcomes = [_outcome(kind, i) for i, (_, kind, _) in enumerate(rows)]

    batch, single = _Recorder(full), _Recorder()
    by_batch = Handoff(config, producer=batch)  # type: ignore[arg-type]
    by_record = Handoff(config, producer=single)  # type: ignore[arg-type]
    origins = ([f"{m.topic()}/{m.partition()}/{m.offset()}" for m in messages]
               if with_origins else None)
    size = sum(len(m.value()) + len(m.key() or b"") for m in messages) if with_size else None
    counts = by_batch.resolve_messages(binding, messages, outcomes, origins, size)
    expected: dict[str, int] = {}
    for msg, outcome in zip(messages, outcomes, strict=True):
        got = by_record.resolve(binding, parcel_from_message(msg), outcome)
        expected[got] = expected.get(got, 0) + 1

    assert sorted(batch.records, key=repr) == sorted(single.records, key=repr)
    for recorder in (batch, single):  # one partition per delay topic (a cycle), any for DLQs
        delay_topics = {t for t, _ in recorder.used if ".delay." in t}
        for topic in delay_topics:
            assert len({p for t, p in recorder.used if t == topic}) == 1
        assert all(0 <= p < 8 if ".delay." in t else p == -1 for t, p in recorder.used)
    assert dict(counts) == expected
    if full:  # every record the fast path tried went the careful way instead
        assert batch.careful == len(batch.records)
    assert by_batch._retries == by_record._retries
    assert by_batch._dead == by_record._dead


def test_a_cycle_writes_a_delay_topic_to_one_partition_and_the_next_cycle_to_the_next() -> None:
    """Records with keys or without, on the fast path or the careful one (a record with
    headers), up to confirm() go to one partition of the delay topic; the next cycle to
    the next one, round the partitions; the broker is asked the count once."""
    recorder = _Recorder(partitions=3)
    handoff = Handoff(Settings(), producer=recorder)  # type: ignore[arg-type]
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0,)))
    messages = [_Msg(i, None) for i in range(10)]  # every other one with a key
    seen = []
    for _ in range(4):
        recorder.used.clear()
        counts = handoff.resolve_messages(binding, messages,
                                          [retry(i, "E: x") for i in range(10)])
        assert counts["retry"] == 10
        slow = parcel_from_message(_Msg(20, [("trace", b"t")]))
        assert handoff.resolve(binding, slow, retry(0, "E: x")) == "retry"
        parts = {p for _, p in recorder.used}
        assert len(recorder.used) == 11 and len(parts) == 1
        seen.append(parts.pop())
        handoff.confirm()
    assert [(b - a) % 3 for a, b in itertools.pairwise(seen)] == [1, 1, 1]
    assert recorder.lookups == 1
    assert {key for _, _, key, _ in recorder.records} == {None, b"k0", b"k2", b"k4", b"k6",
                                                           b"k8", b"k20"}  # keys kept


def test_a_count_the_broker_cannot_tell_leaves_records_to_the_client() -> None:
    recorder = _Recorder(partitions=None)
    handoff = Handoff(Settings(), producer=recorder)  # type: ignore[arg-type]
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0,)))
    for _ in range(3):
        handoff.resolve_messages(binding, [_Msg(i, None) for i in range(5)],
                                 [retry(i, "E: x") for i in range(5)])
        handoff.confirm()
    assert {p for _, p in recorder.used} == {-1}
    assert recorder.lookups == 1  # not asked again before PARTITIONS_RETRY_S


def test_a_failed_confirm_asks_the_broker_again() -> None:
    """A topic may have been made again with fewer partitions: after a hand-off that was
    not delivered, the count is asked again before the records are produced again."""
    recorder = _Recorder(partitions=8)
    handoff = Handoff(Settings(), producer=recorder)  # type: ignore[arg-type]
    binding = Binding("b", Source("kafka", "orders"), "tests.funcs.basic:record",
                      retries=Retries(ladder_s=(1.0,)))
    handoff.resolve_messages(binding, [_Msg(0, None)], [retry(0, "E: x")])
    recorder.fail_next_confirm = True
    try:
        handoff.confirm()
    except HandoffError:
        pass
    else:
        raise AssertionError("confirm() should have raised")
    recorder.partitions = 2
    recorder.used.clear()
    handoff.resolve_messages(binding, [_Msg(0, None)], [retry(0, "E: x")])
    handoff.confirm()
    assert recorder.lookups == 2 and recorder.used[0][1] in (0, 1)
