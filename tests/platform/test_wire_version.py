"""The submit call's wire version: tailers and schedulers built from different schemas
refuse each other's batches (UNIMPLEMENTED, saying why) instead of reading them wrongly,
and the tailer keeps such a batch, spending no attempt, until a scheduler that speaks its
version takes it."""

from __future__ import annotations

import copy
import json
import logging
import threading
from concurrent import futures

import grpc
import pytest

from asynctier.platform import rpc
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.errors import SchedulerUnavailable
from asynctier.platform.rpc import SchedulerClient
from asynctier.platform.schemas import schema_json
from asynctier.platform.wire import encode_items, fingerprint, wire_version
from tests.funcs import basic
from tests.scheduler_harness import items, running_scheduler

NOOP = Binding("noop", Source("kafka", "noop"), "tests.funcs.basic:noop")


def test_the_version_follows_the_schemas_docs_included() -> None:
    """The docs say how the packed columns are laid out: changing them is a new version."""
    submit, outcomes = schema_json("submit"), schema_json("outcomes")
    assert wire_version() == fingerprint([submit, outcomes])
    assert fingerprint([copy.deepcopy(submit), copy.deepcopy(outcomes)]) == wire_version()
    redocumented = copy.deepcopy(outcomes)
    redocumented["fields"][0]["doc"] = "the ids that succeeded: int32 little-endian, packed"
    assert fingerprint([submit, redocumented]) != wire_version()
    changed = copy.deepcopy(outcomes)
    changed["fields"].append({"name": "extra", "type": "bytes"})
    assert fingerprint([submit, changed]) != wire_version()
    assert rpc.SUBMIT.endswith(wire_version())


def test_a_call_of_the_bare_submit_name_is_refused_saying_which_version_is_spoken(
        settings: Settings) -> None:
    """A caller that names no wire version cannot be read safely: it is refused."""
    with running_scheduler(settings, [NOOP]) as sched, \
            grpc.insecure_channel(sched.address) as channel:
        bare = channel.unary_unary(rpc.SUBMIT_PREFIX, request_serializer=None,
                                   response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            bare(encode_items(items("noop", 3)), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert wire_version() in refused.value.details()


def test_a_scheduler_refuses_a_batch_in_another_wire_version(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    with running_scheduler(settings, [NOOP]) as sched:
        with grpc.insecure_channel(sched.address) as channel:
            old = channel.unary_unary(f"{rpc.SUBMIT_PREFIX}Vdeadbeef0000",
                                      request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as refused:
                old(b"not read", timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert wire_version() in refused.value.details()
        # ... while a batch in its own version runs
        assert {o["status"] for o in sched.submit(items("noop", 3)).values()} == {"ok"}
    said = [r.getMessage() for r in caplog.records if "wire version deadbeef0000" in
            r.getMessage()]
    assert said and "same asynctier version" in said[0]


def test_a_tailer_keeps_a_batch_no_scheduler_can_read(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A client of another version gets no outcome (so no attempt is spent): its call
    waits, trying again, until it is stopped; then the batch is unresolved (read again)."""
    caplog.set_level(logging.ERROR)
    with running_scheduler(settings, [NOOP]) as sched:
        client = SchedulerClient(lambda: [sched.address], call_timeout_s=10)
        client.method = f"{rpc.SUBMIT_PREFIX}Vdeadbeef0000"  # as another version would
        stop = threading.Event()
        timer = threading.Timer(2.0, stop.set)
        timer.start()
        try:
            with pytest.raises(SchedulerUnavailable):
                client.submit(items("noop", 3)).result(stop)
        finally:
            timer.cancel()
            client.close()
    said = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"scheduler {sched.address} does not speak")]
    assert len(said) == 1, said  # said once, not at every try
    assert "no attempt spent" in said[0]


def test_during_an_upgrade_a_batch_goes_to_a_scheduler_of_its_own_version(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Two schedulers, the first (tried first) without a submit call of this version (as an
    older release, or another service): it is left alone, and the batch runs on the second,
    each item once."""
    caplog.set_level(logging.ERROR)
    basic.reset()
    recorded = Binding("recorded", Source("kafka", "recorded"), "tests.funcs.basic:record")
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # serves no method of ours
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        with running_scheduler(settings, [recorded]) as sched:
            client = SchedulerClient(lambda: [f"127.0.0.1:{port}", sched.address],
                                     call_timeout_s=30)
            try:
                batch = items("recorded", 5)
                for n, item in enumerate(batch):
                    item["payload"] = json.dumps({"n": n}).encode()
                outcomes = client.submit(batch).result()
            finally:
                client.close()
    finally:
        other.stop(None)
    assert sorted((o["id"], o["status"]) for o in outcomes) == [(n, "ok") for n in range(5)]
    assert sorted(payload["n"] for payload, _ in basic.SEEN) == [0, 1, 2, 3, 4]
    said = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"127.0.0.1:{port} answered UNIMPLEMENTED")]
    assert len(said) == 1 and "another service at that address" in said[0]
