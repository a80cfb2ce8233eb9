"""A scheduler's answer is not taken on trust (``platform/replies.py``): a tailer reading a
real topic sends its batches, through a proxy that answers them badly, to a real
scheduler. Each bad answer claims every record succeeded, yet none ran: had the tailer
believed one, it would have committed records that never ran. Each must be refused, the
batch sent again, nothing committed, the tailer alive, and the log must name the
scheduler's address and what was wrong; once the proxy forwards, every record runs and is
committed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Execution, Source
from asynctier.platform.config import Settings
from asynctier.platform.rpc import CHANNEL_OPTIONS, SUBMIT, SchedulerClient
from asynctier.platform.wire import decode_items, encode_outcomes, ok
from asynctier.tailers.kafka import KafkaTailer
from asynctier.tailers.options import TailerOptions
from tests.faults.harness import produce
from tests.funcs import basic
from tests.helpers import wait_until
from tests.platform_harness import committed_vs_end
from tests.scheduler_harness import Running, running_scheduler

RECORDS = 8

#: Each bad answer, for a batch of n items: every one claims success.
BAD: dict[str, tuple[Callable[[int], bytes], str]] = {
    "id-out-of-range": (lambda n: encode_outcomes([ok(i) for i in range(n - 1)] + [ok(n)]),
                        "that the call did not send"),
    "negative-id": (lambda n: encode_outcomes([ok(-1)] + [ok(i) for i in range(1, n)]),
                    "that the call did not send"),
    "duplicate-id": (lambda n: encode_outcomes([ok(i) for i in range(n)] + [ok(0)]),
                     "more than once"),
    "missing-id": (lambda n: encode_outcomes([ok(i) for i in range(n - 1)]), "none for"),
    "garbage": (lambda n: b"\xde\xad\xbe\xef not an answer" * 3, "does not decode"),
}


class Proxy(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A submit method in front of a scheduler: answers with ``bad`` (counting), or, once
    ``bad`` is None, forwards each call."""

    def __init__(self, target: str, bad: Callable[[int], bytes] | None) -> None:
        self.bad = bad
        self.bad_answers = 0
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._forward = self._channel.unary_unary(SUBMIT, request_serializer=None,
                                                  response_deserializer=None)
        self._server = grpc.server(ThreadPoolExecutor(4), options=CHANNEL_OPTIONS)
        self._server.add_generic_rpc_handlers((self,))
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def service(self, details: Any) -> Any:
        if details.method != SUBMIT:
            return None
        return grpc.unary_unary_rpc_method_handler(self._submit, request_deserializer=None,
                                                   response_serializer=None)

    def _submit(self, request: bytes, context: Any) -> bytes:
        bad = self.bad
        if bad is None:
            return self._forward(request, timeout=60)  # type: ignore[no-any-return]
        self.bad_answers += 1
        return bad(len(decode_items(request)))

    def close(self) -> None:
        self._server.stop(0)
        self._channel.close()


@pytest.fixture(scope="module")
def module_settings(kafka_bootstrap: str, redis_url: str) -> Settings:
    return Settings(kafka={"bootstrap.servers": kafka_bootstrap}, redis_url=redis_url,
                    prefix="t" + uuid.uuid4().hex[:10])


@pytest.fixture(scope="module")
def scheduler(module_settings: Settings) -> Iterator[Running]:
    bindings = [Binding(f"bad-{kind}", Source("kafka", "unused"), "tests.funcs.basic:record",
                        execution=Execution(idempotent=True))
                for kind in BAD]
    with running_scheduler(module_settings, bindings) as sched:
        yield sched


def _ran(binding: str) -> list[int]:
    return sorted(payload["id"] for payload, ctx in list(basic.SEEN)
                  if ctx.binding == binding)


@pytest.mark.parametrize("kind", list(BAD))
def test_a_bad_answer_is_refused_and_the_batch_sent_again(
        kind: str, scheduler: Running, module_settings: Settings,
        unique_topic: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    settings = module_settings
    bad, says = BAD[kind]
    topic = unique_topic(1)
    produce(settings, topic, [{"id": i} for i in range(RECORDS)])
    binding = Binding(f"bad-{kind}", Source("kafka", topic), "tests.funcs.basic:record",
                      execution=Execution(idempotent=True))
    group = settings.names.group(binding.name)
    proxy = Proxy(scheduler.address, bad)
    client = SchedulerClient(lambda: [proxy.address])
    tailer = KafkaTailer(settings, binding, client, TailerOptions(batch_size=RECORDS))
    stop = threading.Event()
    thread = threading.Thread(target=tailer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: proxy.bad_answers >= 2, 60, "the batch sent again after a bad "
                   "answer")
        assert thread.is_alive(), "the tailer died on a bad answer"
        assert committed_vs_end(settings, group, topic) == (0, RECORDS), \
            "something was committed on a bad answer's word"
        assert _ran(binding.name) == [], "the proxy forwarded nothing, yet records ran?"
        refusals = [r.getMessage() for r in caplog.records
                    if "sent a bad answer" in r.getMessage()]
        assert refusals and all(proxy.address in m and says in m for m in refusals), refusals
        proxy.bad = None  # the scheduler answers for itself from now on
        wait_until(lambda: committed_vs_end(settings, group, topic) == (RECORDS, RECORDS),
                   60, "every record committed once the answers are sound")
        assert sorted(set(_ran(binding.name))) == list(range(RECORDS))
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(60)
        client.close()
        proxy.close()
