"""Which records a Kafka tailer sends as fresh (docs/design.md, Run once off the path), on
the real Kafka and Redis, seen by a proxy in front of the scheduler: the records in the
log when the tailer took its partition may have been sent before (claimed first); those
written after are fresh; a call sent again says so, and none of its records is then
treated as fresh; a retry back from a delay topic is never fresh."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from asynctier.platform.rpc import RESENT_KEY, SchedulerClient
from asynctier.platform.wire import decode_items, encode_outcomes, ok
from asynctier.scheduler.core import _resent
from asynctier.tailers.kafka import KafkaTailer
from asynctier.tailers.options import TailerOptions
from tests.faults.harness import produce
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end
from tests.tailers.test_bad_replies import Proxy
from tests.tailers.test_delay_tailer import LADDER, DelayProcess, fail_first_attempts

RECORDS = 4


class Recorder(Proxy):
    """Answers every item ok itself, the first ``fail_first`` calls with an error (the
    tailer sends them again); keeps (id, fresh, resent) per item of each call."""

    def __init__(self, fail_first: int = 0) -> None:
        super().__init__("127.0.0.1:1", None)
        self.fail_first = fail_first
        self.seen: list[tuple[int, bool, bool]] = []

    def _submit(self, request: bytes, context: Any) -> bytes:
        items = decode_items(request)
        resent = _resent(context)
        self.seen += [(int(i["source_ref"].rsplit("/", 1)[1]), bool(i.get("fresh")), resent)
                      for i in items]
        if self.fail_first > 0:
            self.fail_first -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "not now")
        return encode_outcomes([ok(i["id"]) for i in items])


@contextlib.contextmanager
def _tailer(settings: Settings, binding: Binding, proxy: Recorder) -> Iterator[KafkaTailer]:
    """A Kafka tailer of ``binding`` sending to ``proxy``, in a thread, stopped after."""
    client = SchedulerClient(lambda: [proxy.address])
    tailer = KafkaTailer(settings, binding, client, TailerOptions(batch_size=RECORDS))
    stop = threading.Event()
    thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield tailer
    finally:
        stop.set()
        thread.join(60)
        client.close()


def _run(settings: Settings, binding: Binding, proxy: Recorder, until: Callable[[], bool],
         what: str) -> None:
    with _tailer(settings, binding, proxy):
        wait_until(until, 60, what)


def test_records_written_after_the_partition_was_taken_are_fresh(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    binding = Binding("fresh", Source("kafka", topic), "tests.funcs.basic:record")
    group = settings.names.group(binding.name)
    produce(settings, topic, [{"id": i} for i in range(RECORDS)])  # there before the tailer
    proxy = Recorder()
    try:
        with _tailer(settings, binding, proxy):
            wait_until(lambda: committed_vs_end(settings, group, topic) == (RECORDS, RECORDS),
                       60, "the records there before the tailer")
            produce(settings, topic, [{"id": i} for i in range(RECORDS, 2 * RECORDS)])
            wait_until(lambda: committed_vs_end(settings, group, topic)[0] == 2 * RECORDS,
                       60, "the records written after")
        assert proxy.seen == [(n, n >= RECORDS, False) for n in range(2 * RECORDS)]
        # the next tailer (a restart) takes the mark, which the first raised a leap past
        # what it sent: the records below it are claimed first, fresh or not in truth
        produce(settings, topic, [{"id": i} for i in range(2 * RECORDS, 3 * RECORDS)])
        proxy.seen.clear()
        _run(settings, binding, proxy,
             lambda: committed_vs_end(settings, group, topic)[0] == 3 * RECORDS,
             "the records of the restart")
        assert proxy.seen == [(n, False, False) for n in range(2 * RECORDS, 3 * RECORDS)]
    finally:
        proxy.close()


def test_a_call_sent_again_says_so(settings: Settings,
                                   unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    binding = Binding("resent", Source("kafka", topic), "tests.funcs.basic:record")
    group = settings.names.group(binding.name)
    proxy = Recorder(fail_first=1)
    try:
        with _tailer(settings, binding, proxy) as tailer:
            wait_until(lambda: bool(tailer.source and tailer.source.owned), 60, "assigned")
            wait_until(lambda: tailer.source is not None and tailer.source.marks is not None
                       and bool(tailer.source.marks.fresh_from), 60, "the mark taken")
            produce(settings, topic, [{"id": i} for i in range(RECORDS)])
            wait_until(lambda: committed_vs_end(settings, group, topic)[0] == RECORDS, 60,
                       "the records, after one failed call")
        first, again = proxy.seen[:RECORDS], proxy.seen[RECORDS:2 * RECORDS]
        assert first == [(n, True, False) for n in range(RECORDS)]
        assert again == [(n, True, True) for n in range(RECORDS)]  # the scheduler claims them
    finally:
        proxy.close()


def test_the_scheduler_reads_the_resent_mark() -> None:
    class Context:
        def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
            self.metadata = metadata

        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return self.metadata

    assert _resent(Context(((RESENT_KEY, "1"),)))
    assert not _resent(Context((("user-agent", "x"),)))


def test_a_binding_fresh_from_its_start_sends_its_backlog_fresh(
        settings: Settings, unique_topic: Callable[..., str]) -> None:
    """Bound by a release with marks, a partition without a mark was never sent from: the
    records there before the first tailer are fresh too."""
    topic = unique_topic(1)
    binding = Binding("new", Source("kafka", topic), "tests.funcs.basic:record",
                      fresh_from_start=True)
    group = settings.names.group(binding.name)
    produce(settings, topic, [{"id": i} for i in range(RECORDS)])
    proxy = Recorder()
    try:
        _run(settings, binding, proxy,
             lambda: committed_vs_end(settings, group, topic) == (RECORDS, RECORDS),
             "the backlog")
        assert proxy.seen == [(n, True, False) for n in range(RECORDS)]
    finally:
        proxy.close()


def test_bind_makes_a_binding_fresh_from_its_start_and_keeps_an_older_ones_value(
        settings: Settings, unique_topic: Callable[..., str], kafka_bootstrap: str,
        redis_url: str) -> None:
    topic = unique_topic(1)
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": kafka_bootstrap, "ASYNCTIER_REDIS_URL": redis_url,
           "ASYNCTIER_PREFIX": settings.prefix, "ASYNCTIER_ALLOW_MODULES": "tests"}
    registry = BindingRegistry(settings)
    registry.put(Binding("old", Source("kafka", topic), "tests.funcs.basic:record"))
    for name in ("old", "new"):
        result = CliRunner().invoke(main, ["bind", name, "--topic", topic, "--function",
                                           "tests.funcs.basic:record"], env=env)
        assert result.exit_code == 0, result.output
    bound = registry.load()
    assert (bound["old"].fresh_from_start, bound["new"].fresh_from_start) == (False, True)


def test_a_retry_back_from_a_delay_topic_is_never_fresh(settings: Settings) -> None:
    """R5 of the design: a record read from a delay topic ran before (its attempt failed),
    and another copy of it may run: the delay tailers send it to be claimed, never fresh,
    even for a binding whose main tailer sends its backlog fresh."""
    binding = Binding("retried", Source("kafka", f"{settings.prefix}.src"),
                      "tests.funcs.basic:record", retries=Retries(5, LADDER),
                      fresh_from_start=True)
    BindingRegistry(settings).put(binding)
    ensure_binding_topics(settings, [binding])
    proxy = Recorder()
    delay = DelayProcess(settings, proxy.address).start()
    try:
        fail_first_attempts(settings, binding, [{"id": i} for i in range(RECORDS)])
        wait_until(lambda: len(proxy.seen) >= RECORDS, 60,
                   "the retries back from the delay topic")
    finally:
        delay.close()
        proxy.close()
    assert sorted(proxy.seen) == [(n, False, False) for n in range(RECORDS)]
