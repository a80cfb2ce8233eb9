"""The SDK: submit workloads to a binding through the Submitters.

    from asynctier import Client

    client = Client.from_env()            # the Submitters of asynctier.toml / ASYNCTIER_SUBMITTERS
    result = client.submit("resize", {"image": "a.png"}, priority=10)
    results = client.submit_many("resize", payloads)   # one Result per payload, in order
    client.submit("publish", {"video": 7}, id="pub-7", after=["enc-7-hd", "enc-7-sd"])

A payload is bytes (sent as they are), a str (UTF-8) or anything else (JSON). Calls are
batched (``max_batch`` workloads a call) and spread over the Submitters; a Submitter that
does not answer (UNAVAILABLE, or RESOURCE_EXHAUSTED: it is full) is left for another,
and ``throttled`` workloads are sent again after their retry-after, with backoff, until
``deadline_s``. A workload sent again after a lost answer may be written twice unless it
has an id (a queue item with an id is written once: the second answer is ``duplicate``).

``after`` (queue bindings): the ids the workload waits for, each acked first (an id of the
binding's topic, or a ``(topic, id)`` pair); a parent must exist already or come earlier in
the same call, and one that dies makes the workload dead ``parent_failed`` unless
``on_parent_failure="run"``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpc

from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError
from asynctier.platform.rpc import CHANNEL_OPTIONS
from asynctier.platform.rpcsecurity import RpcSecurity, open_channel
from asynctier.platform.tracing import with_current_context
from asynctier.submitter.protocol import (
    METHOD,
    RETRY_AFTER_KEY,
    Call,
    Parent,
    Result,
    Workload,
    decode_results,
    encode_call,
)

__all__ = ["AsyncClient", "BindingNotFound", "Client", "InvalidWorkload", "Result",
           "SubmitterUnavailable", "Workload"]

#: Statuses a call is sent again for (to another Submitter, after a backoff).
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED)


class SubmitError(AsynctierError):
    """A submission that did not go through."""


class InvalidWorkload(SubmitError):
    """A workload (or an all-or-nothing call) the Submitter refused as invalid; ``result``
    holds the reason (None for a whole call)."""

    def __init__(self, message: str, result: Result | None = None) -> None:
        super().__init__(message)
        self.result = result


class BindingNotFound(SubmitError):
    """The call named a binding the Submitter does not know."""


class SubmitterUnavailable(SubmitError):
    """No Submitter answered before the deadline."""


def parent_refs(after: Iterable[str | tuple[str, str]]) -> tuple[Parent, ...]:
    """``after`` as the wire's parents: an id of the binding's topic, or (topic, id)."""
    if isinstance(after, str):
        raise TypeError("after takes a list of ids, not one id: after=[id]")
    return tuple((None, p) if isinstance(p, str) else (p[0], p[1]) for p in after)


def as_payload(payload: Any) -> bytes:
    """bytes as they are, a str as UTF-8, anything else as JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode()
    return json.dumps(payload, separators=(",", ":")).encode()


class Client:
    """A connection to the Submitters (``addresses``), reused for every call; thread-safe.

    ``security``: how channels are secured (``settings.rpc``: TLS, mutual TLS, a token;
    default: plaintext to loopback only). ``credentials``: gRPC channel credentials of
    your own instead (``grpc.ssl_channel_credentials``). ``deadline_s``: how long a
    submission keeps trying (throttled workloads, Submitters down) before it returns
    what it has (throttled ones stay ``throttled``) or raises SubmitterUnavailable.
    """

    def __init__(self, addresses: Sequence[str], *, deadline_s: float = 60.0,
                 call_timeout_s: float = 30.0, max_batch: int = 1000,
                 credentials: grpc.ChannelCredentials | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (),
                 security: RpcSecurity | None = None) -> None:
        if not addresses:
            raise SubmitError("no Submitter address given: list them in asynctier.toml "
                              "(submitters = [...]) or ASYNCTIER_SUBMITTERS")
        self.addresses = list(addresses)
        self.deadline_s = deadline_s
        self.call_timeout_s = call_timeout_s
        self.max_batch = max_batch
        self._credentials = credentials
        self._security = security or RpcSecurity()
        self._options = [*CHANNEL_OPTIONS, *channel_options]
        self._channels: dict[str, tuple[grpc.Channel, Any]] = {}
        self._down: dict[str, float] = {}
        self._rr = itertools.count(random.randrange(len(self.addresses)))
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Client:
        """A client of ``settings.submitters``, secured by ``settings.rpc``."""
        options.setdefault("security", settings.rpc)
        return cls(settings.submitters, **options)

    @classmethod
    def from_env(cls, **options: Any) -> Client:
        """A client of the configured Submitters (asynctier.toml, then the environment)."""
        return cls.from_settings(Settings.load(), **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            for channel, _ in self._channels.values():
                channel.close()
            self._channels.clear()

    # ----------------------------------------------------------------- submitting

    def submit(self, binding: str, payload: Any, *, key: bytes | None = None,
               priority: int | None = None, delay: float | None = None,
               id: str | None = None, headers: Iterable[tuple[str, bytes | None]] = (),
               after: Iterable[str | tuple[str, str]] = (),
               on_parent_failure: str | None = None) -> Result:
        """Submit one workload; raises InvalidWorkload when it is refused as invalid."""
        [result] = self.submit_many(binding, [payload], key=key, priority=priority,
                                    delay=delay, ids=None if id is None else [id],
                                    headers=headers, after=after,
                                    on_parent_failure=on_parent_failure)
        if result.status == "invalid":
            raise InvalidWorkload(result.reason or "invalid", result)
        return result

    def submit_many(self, binding: str, payloads: Iterable[Any], *, key: bytes | None = None,
                    priority: int | None = None, delay: float | None = None,
                    ids: Sequence[str] | None = None,
                    headers: Iterable[tuple[str, bytes | None]] = (),
                    after: Iterable[str | tuple[str, str]] = (),
                    on_parent_failure: str | None = None,
                    all_or_nothing: bool = False) -> list[Result]:
        """Submit many workloads in batched calls (in order: a parent before its children);
        one Result per payload, in order (its ``position`` the payload's index). A payload
        may be a :class:`Workload` (its own fields); ``key``, ``priority``, ``delay``,
        ``headers``, ``after`` and ``on_parent_failure`` apply to the others."""
        workloads = self.workloads(payloads, key=key, priority=priority, delay=delay,
                                   ids=ids, headers=headers, after=after,
                                   on_parent_failure=on_parent_failure)
        if all_or_nothing and len(workloads) > self.max_batch:
            raise SubmitError(f"all or nothing takes at most {self.max_batch} workloads "
                              "(one call)")
        results: list[Result] = []
        for at in range(0, len(workloads), self.max_batch):
            part = workloads[at:at + self.max_batch]
            got = self._send_batch(binding, part, all_or_nothing)
            results += [_at(r, at + r.position) for r in got]
        return results

    @staticmethod
    def workloads(payloads: Iterable[Any], *, key: bytes | None = None,
                  priority: int | None = None, delay: float | None = None,
                  ids: Sequence[str] | None = None,
                  headers: Iterable[tuple[str, bytes | None]] = (),
                  after: Iterable[str | tuple[str, str]] = (),
                  on_parent_failure: str | None = None) -> list[Workload]:
        """The workloads of ``payloads`` with the shared fields."""
        shared = with_current_context(tuple(headers))
        delay_ms = None if delay is None else round(delay * 1000)
        parents = parent_refs(after)
        out = []
        for i, p in enumerate(payloads):
            if isinstance(p, Workload):
                out.append(p)
            else:
                out.append(Workload(as_payload(p), key, shared, priority, delay_ms,
                                    None if ids is None else ids[i], parents,
                                    on_parent_failure))
        return out

    def _send_batch(self, binding: str, workloads: list[Workload], all_or_nothing: bool
                    ) -> list[Result]:
        """One batch until every workload is answered other than throttled, or the
        deadline."""
        deadline = time.monotonic() + self.deadline_s
        results: list[Result | None] = [None] * len(workloads)
        todo = list(range(len(workloads)))
        backoff = 0.05
        while True:
            got = self._call(Call(binding, [workloads[i] for i in todo], all_or_nothing),
                             deadline)
            again: list[int] = []
            wait_ms = 0
            for r in got:
                i = todo[r.position]
                results[i] = _at(r, i)
                if r.status == "throttled":
                    again.append(i)
                    wait_ms = max(wait_ms, r.retry_after_ms or 0)
            if not again:
                break
            pause = max(wait_ms / 1000, backoff) * random.uniform(1.0, 1.2)
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            backoff = min(backoff * 2, 2.0)
            todo = again
        return [r for r in results if r is not None]

    def _call(self, call: Call, deadline: float) -> list[Result]:
        """One call, moved to another Submitter (with backoff) on UNAVAILABLE and
        RESOURCE_EXHAUSTED until ``deadline``."""
        request = encode_call(call)
        backoff = 0.05
        last = "none tried"
        first = True
        while True:
            address = self._pick()
            # the first try has its whole call timeout; tries after it end by the deadline
            timeout = (self.call_timeout_s if first
                       else max(0.5, min(self.call_timeout_s, deadline - time.monotonic())))
            first = False
            try:
                reply = self._stub(address)(request, timeout=timeout, wait_for_ready=False)
                return decode_results(reply)
            except grpc.RpcError as exc:
                code, detail = exc.code(), exc.details() or ""
                if code == grpc.StatusCode.NOT_FOUND:
                    raise BindingNotFound(detail) from exc
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidWorkload(detail) from exc
                if code not in _RETRIED:
                    raise SubmitError(f"Submitter {address} answered {code.name}: "
                                      f"{detail}") from exc
                last = f"{address}: {code.name} {detail}"
                pause = backoff
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    pause = max(pause, _retry_after(exc))
                else:
                    self._mark_down(address)
            if time.monotonic() + pause > deadline:
                raise SubmitterUnavailable(f"no Submitter took the call within "
                                           f"{self.deadline_s:g}s (last: {last})")
            time.sleep(pause * random.uniform(1.0, 1.2))
            backoff = min(backoff * 2, 2.0)

    def _pick(self) -> str:
        now = time.monotonic()
        live = [a for a in self.addresses if self._down.get(a, 0.0) <= now] or self.addresses
        return live[next(self._rr) % len(live)]

    def _mark_down(self, address: str, for_s: float = 2.0) -> None:
        self._down[address] = time.monotonic() + for_s

    def _stub(self, address: str) -> Any:
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                channel = (grpc.secure_channel(address, self._credentials, self._options)
                           if self._credentials is not None
                           else open_channel(address, self._security, self._options))
                stub = channel.unary_unary(METHOD, request_serializer=None,
                                           response_deserializer=None)
                entry = self._channels[address] = (channel, stub)
            return entry[1]


class AsyncClient:
    """:class:`Client` for asyncio code: the same calls as coroutines (each runs the sync
    client in a worker thread, so the event loop never blocks)."""

    def __init__(self, addresses: Sequence[str], **options: Any) -> None:
        self.client = Client(addresses, **options)

    @classmethod
    def from_env(cls, **options: Any) -> AsyncClient:
        """An async client of the configured Submitters."""
        return cls(Settings.load().submitters, **options)

    async def submit(self, binding: str, payload: Any, **fields: Any) -> Result:
        """:meth:`Client.submit`."""
        return await asyncio.to_thread(self.client.submit, binding, payload, **fields)

    async def submit_many(self, binding: str, payloads: Iterable[Any], **fields: Any
                          ) -> list[Result]:
        """:meth:`Client.submit_many`."""
        return await asyncio.to_thread(self.client.submit_many, binding, list(payloads),
                                       **fields)

    async def close(self) -> None:
        """Close the channels."""
        self.client.close()


def _at(result: Result, position: int) -> Result:
    if result.position == position:
        return result
    return Result(result.status, position, result.id, result.topic, result.partition,
                  result.offset, result.reason, result.retry_after_ms)


def _retry_after(exc: grpc.RpcError) -> float:
    for k, v in exc.trailing_metadata() or ():
        if k == RETRY_AFTER_KEY:
            try:
                return int(v) / 1000
            except ValueError:
                return 0.2
    return 0.2
