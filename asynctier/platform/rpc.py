"""The submit RPC on gRPC: one call carries one batch (Avro bytes) and returns its outcomes.

No protobuf: the method takes and returns bytes encoded by :mod:`asynctier.platform.wire`.
The server side is :func:`submit_handler` (mounted by the scheduler on a ``grpc.aio``
server); the client side is :class:`SchedulerClient`, which spreads batches over the live
schedulers and moves a batch to another scheduler when one dies mid-call. An outcome that
never came back is unknown, never done: the whole batch is sent again.

A record whose function kills its worker process (``os._exit``, a segfault, the OOM killer)
would kill every scheduler it is sent to, forever. So a batch whose scheduler died while
running it (the connection dropped mid-call, as opposed to no scheduler to connect to)
is sent again whole once; after :data:`CRASHES_BEFORE_ISOLATING` such deaths its items are
sent one at a time, and an item that killed a scheduler that many times on its own gets a
``retry`` outcome that spends an attempt. Its attempt count then travels in the delay
topic's headers (it survives any crash), and after max attempts it is a dead letter.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from typing import Any

import grpc

from asynctier.platform.errors import BadReply, SchedulerUnavailable
from asynctier.platform.replies import read_outcomes
from asynctier.platform.rpcsecurity import RpcSecurity, failure_hint, open_channel
from asynctier.platform.stream import RUN_STREAM, STREAM_VERSION, Events, StreamCall
from asynctier.platform.wire import (
    TOO_LARGE,
    Item,
    Outcome,
    decode_items,
    encode_items,
    encode_outcomes,
    failed,
    retry,
    wire_version,
)

log = logging.getLogger(__name__)

SERVICE = "asynctier.Scheduler"
#: The submit method's name carries the wire's version (:func:`wire_version`): a tailer and
#: a scheduler built from different schemas (a rolling upgrade half done) never read each
#: other's bytes; the scheduler answers UNIMPLEMENTED, and the tailer keeps the batch (no
#: attempt spent) until a scheduler that speaks its version takes it.
WIRE_VERSION = wire_version()
SUBMIT_PREFIX = f"/{SERVICE}/Submit"
SUBMIT = f"{SUBMIT_PREFIX}V{WIRE_VERSION}"
#: How long a scheduler that speaks another wire is left alone, and how often it is logged.
WRONG_WIRE_BACKOFF_S = 10.0
WRONG_WIRE_LOG_EVERY_S = 30.0
#: The metadata of a submit call sent again (no answer, a bad one, or another scheduler):
#: a copy may be running already, so the scheduler claims all its items before they run.
RESENT_KEY = "asynctier-resent"
RESENT = ((RESENT_KEY, "1"),)
MAX_MESSAGE = 64 * 1024 * 1024
#: The record bytes (values, keys and headers: :func:`header_bytes`) one submit call
#: carries at most: a batch of large records is cut into several calls, well under
#: :data:`MAX_MESSAGE` (which a call over it would fail at every try). Only a single record
#: larger than that travels alone.
MAX_CALL_BYTES = 16 * 1024 * 1024
#: The largest submit request sent: one record larger than this (only a topic configured
#: past :data:`MAX_MESSAGE` holds one) can never reach a scheduler, so its call is answered
#: at once, ``failed`` with reason :data:`~asynctier.platform.wire.TOO_LARGE`, and the record
#: goes to the dead-letter topic whole instead of holding its binding back for ever.
MAX_REQUEST_BYTES = MAX_MESSAGE - 64 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

SubmitFn = Callable[[bytes, Any], Awaitable[bytes]]
#: The run stream's method (:mod:`asynctier.platform.stream`): requests in, messages out.
RunFn = Callable[[AsyncIterator[bytes], Any], AsyncIterator[bytes]]


def header_bytes(headers: Iterable[tuple[str, bytes | None]]) -> int:
    """What a record's headers add to a submit call, near enough."""
    return sum(len(name) + (len(data) if data else 0) for name, data in headers)


#: Scheduler deaths mid-call after which a batch is split into single items, and after
#: which a single item is blamed (a failed attempt).
CRASHES_BEFORE_ISOLATING = 2
WORKER_DIED = ("the scheduler process died {n} times while running this item alone "
               "(os._exit, a crash or the OOM killer?); counted as a failed attempt")


NO_SCHEDULER = "no scheduler is configured or registered"
#: What an operator does about it.
NO_SCHEDULER_HINT = ("start `asynctier run scheduler`, or list schedulers in asynctier.toml "
                     "(schedulers) or ASYNCTIER_SCHEDULERS")


class NoScheduler(grpc.RpcError):  # type: ignore[misc]
    """No scheduler is configured or registered: the call's future fails with this, and
    the batch waits for one (it is sent again once one registers)."""

    def code(self) -> grpc.StatusCode:
        """UNAVAILABLE, as for a scheduler nobody could connect to."""
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        """Says what is missing."""
        return NO_SCHEDULER


NO_SCHEDULER_LOG_EVERY_S = 30.0
#: How long a scheduler nobody can connect to is left alone: the membership's TTL (5 s)
#: and the directory's cache (1 s), after which a dead one has dropped out. (A call it
#: failed otherwise leaves it alone 2 s.) So a tailer whose region's schedulers were all
#: killed keeps its calls away until they are gone, rather than trying them every 2 s.
REFUSED_DOWN_S = 6.0
#: How long a client that does not wait for schedulers (a one-off command) keeps trying.
GIVE_UP_S = 30.0


def died_mid_call(exc: grpc.RpcError) -> bool:
    """True when the scheduler went away while it had the call (not: nobody to connect to)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    return code == grpc.StatusCode.UNAVAILABLE and "failed to connect" not in details


def submit_handler(submit: SubmitFn, run: RunFn | None = None) -> grpc.GenericRpcHandler:
    """A gRPC handler for ``Submit`` calling ``await submit(request_bytes, context)``, and
    for the run stream (``run(requests, context)`` yields the messages) when given; a
    submit in another wire version is refused (UNIMPLEMENTED), saying so."""
    return _SubmitHandler(submit, run)


class _SubmitHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, submit: SubmitFn, run: RunFn | None = None) -> None:
        self._submit = grpc.unary_unary_rpc_method_handler(
            submit, request_deserializer=None, response_serializer=None)
        self._run = None if run is None else grpc.stream_stream_rpc_method_handler(
            run, request_deserializer=None, response_serializer=None)
        self._logged = -WRONG_WIRE_LOG_EVERY_S

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method == SUBMIT:
            return self._submit
        if method == RUN_STREAM and self._run is not None:
            return self._run
        if method.startswith(SUBMIT_PREFIX):
            theirs = _version_of(method)

            async def refuse(request: bytes, context: Any) -> bytes:
                await self._other_wire(theirs, context)
                return b""  # not reached: abort raises

            return grpc.unary_unary_rpc_method_handler(
                refuse, request_deserializer=None, response_serializer=None)
        return None

    async def _other_wire(self, theirs: str, context: Any) -> None:
        now = time.monotonic()
        if now - self._logged >= WRONG_WIRE_LOG_EVERY_S:
            self._logged = now
            log.error("a tailer at %s sent a batch in wire version %s; this scheduler speaks "
                      "%s, so it cannot read it and refuses it (the tailer keeps the batch). "
                      "Run the same asynctier version on tailers and schedulers.",
                      context.peer(), theirs, WIRE_VERSION)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"this scheduler speaks wire version {WIRE_VERSION}, not {theirs}")


def _version_of(method: str) -> str:
    """The wire version named by a submit method (``.../Submit`` names none)."""
    rest = method[len(SUBMIT_PREFIX):]
    return rest[1:] if rest.startswith("V") else (rest or "(none: an older asynctier)")


Addresses = Callable[[], Sequence[str]]
#: Where the next call goes, given the addresses left alone for now (down): the schedulers
#: to pick from (see :meth:`asynctier.platform.membership.SchedulerDirectory.place`).
Place = Callable[[Collection[str]], Sequence[str]]


class PendingCall:
    """A submit call under way; :meth:`result` waits for its outcomes."""

    def __init__(self, client: SchedulerClient, items: list[Item] | None, payload: bytes,
                 count: int | None = None, spread: str | None = None) -> None:
        self.client = client
        self.spread = spread  # calls of one spread key go round the schedulers in turn
        self._items = items
        self.count = len(items) if items is not None else (count or 0)
        self.payload = payload
        self.crashes = 0
        if len(payload) > MAX_REQUEST_BYTES:
            self.address, self.future = "", self._too_large()
        else:
            self.address, self.future = client._send(payload, spread)

    @property
    def ids(self) -> Sequence[int]:
        """The ids of the call's items: its answer must name each of them once."""
        return range(self.count) if self._items is None else [i["id"] for i in self._items]

    @property
    def items(self) -> list[Item]:
        """The batch's items (decoded from the request when it was sent pre-encoded)."""
        if self._items is None:
            self._items = decode_items(self.payload)
        return self._items

    def result(self, stop: threading.Event | None = None) -> list[Outcome]:
        """The outcomes; on a scheduler failure the batch is sent again elsewhere.

        An answer that fails :func:`~asynctier.platform.replies.read_outcomes`'s checks is
        a scheduler failure too: nothing is taken from it, and the batch is sent again.
        Raises SchedulerUnavailable only when ``stop`` is set before any scheduler answered,
        or, for a client that does not wait for schedulers, when none answered for
        :data:`GIVE_UP_S`.
        """
        since = time.monotonic()
        while True:
            try:
                reply = self.future.result()
                return read_outcomes(reply, self.ids)
            except BadReply as exc:
                self.client.bad_reply(self.address, self.count, exc)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    return self._refused(exc)
                if isinstance(exc, NoScheduler):
                    pass  # logged by the client; wait for one to register
                elif code == grpc.StatusCode.UNIMPLEMENTED:  # another version: no attempt spent
                    self.client._not_our_wire(self.address, exc)
                else:
                    details = (exc.details() if hasattr(exc, "details") else "") or ""
                    log.warning("scheduler %s failed a batch of %d item(s) (%s); "
                                "sending the batch again%s", self.address, self.count, code,
                                failure_hint(code, details, self.client.security))
                    died = died_mid_call(exc)
                    refused = code == grpc.StatusCode.UNAVAILABLE and not died
                    self.client._mark_down(self.address, REFUSED_DOWN_S if refused else 2.0)
                    self.crashes += died
            if stop is not None and stop.is_set():
                raise SchedulerUnavailable("stopping before the batch was resolved")
            if not self.client._wait_for_scheduler and time.monotonic() - since > GIVE_UP_S:
                raise SchedulerUnavailable(
                    f"no scheduler answered for {GIVE_UP_S:g}s (last tried: "
                    f"{self.address or 'none known'}); is `asynctier run` up?")
            if self.crashes >= CRASHES_BEFORE_ISOLATING:
                return self._isolate(stop)
            self.client._wait_for_one(stop)
            self.address, self.future = self.client._send(self.payload, self.spread,
                                                          resent=True)

    def _too_large(self) -> Future[bytes]:
        """The answer to a call too large to send: every item failed (a dead letter)."""
        log.error("a batch of %d item(s) takes %s bytes, more than the %s a submit call "
                  "carries: not sent; each item goes to its binding's dead-letter topic "
                  "(reason too_large)", self.count, f"{len(self.payload):,}",
                  f"{MAX_REQUEST_BYTES:,}")
        answer: Future[bytes] = Future()
        answer.set_result(encode_outcomes([
            failed(i["id"], f"the record and its batch take {len(self.payload):,} bytes, more "
                            f"than the {MAX_REQUEST_BYTES:,} a call to the scheduler carries: "
                            "it was not run", TOO_LARGE)
            for i in self.items]))
        return answer

    def _refused(self, exc: grpc.RpcError) -> list[Outcome]:
        """The scheduler could not read the batch: sending it again would not help, so
        every item is a failed attempt (and, once its attempts are spent, a dead letter)."""
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        log.error("scheduler %s refused a batch of %d item(s) as unreadable (%s); each "
                  "counts as a failed attempt", self.address, self.count, detail)
        return [retry(i["id"], f"the scheduler could not read the batch: {detail}")
                for i in self.items]

    def _isolate(self, stop: threading.Event | None) -> list[Outcome]:
        """The batch killed its scheduler again and again: find the item that does it."""
        if len(self.items) == 1:
            item = self.items[0]
            log.error("item %s (attempt %d) killed a scheduler %d times on its own; it counts "
                      "as a failed attempt", item["source_ref"], item["attempt"], self.crashes)
            return [retry(item["id"], WORKER_DIED.format(n=self.crashes))]
        log.error("schedulers died %d times while running a batch of %d item(s); sending its "
                  "items one at a time to find the one that kills them", self.crashes,
                  len(self.items))
        outcomes: list[Outcome] = []
        for item in self.items:  # one after another: a crash must not take the others along
            outcomes.extend(self.client.submit([item]).result(stop))
        return outcomes


class SchedulerClient:
    """Sends batches to schedulers; ``addresses()`` gives the live ones (re-read often).

    A call has no deadline by default (``call_timeout_s=None``): a batch takes as long as
    its items, each ended by its binding's ``--timeout`` (up to 1 h) in the scheduler, and
    a deadline shorter than that would cut a long batch off and send it again, a limit
    silently lower than the binding's. A scheduler that died or became unreachable is
    found by gRPC keepalive (a ping every 10 s, 5 s to answer) and the batch goes
    elsewhere.

    ``security``: how channels are secured (``settings.rpc``; default: plaintext, loopback
    only). ``place``: chooses the schedulers of each call (the tailer's region first);
    without it every live address takes its turn."""

    def __init__(self, addresses: Addresses, call_timeout_s: float | None = None,
                 wait_for_scheduler: bool = True,
                 security: RpcSecurity | None = None, place: Place | None = None) -> None:
        self._addresses = addresses
        self._place = place
        self.security = security or RpcSecurity()
        self._channels: dict[str, tuple[grpc.Channel, Any]] = {}
        self._down: dict[str, float] = {}
        self._rr = itertools.count()
        self._rr_by: dict[str, Iterator[int]] = {}
        self._timeout = call_timeout_s
        self._lock = threading.Lock()
        self._wrong_wire_logged: dict[str, float] = {}
        self._no_scheduler_logged = -NO_SCHEDULER_LOG_EVERY_S
        # a tailer waits for a scheduler to come up; a one-off command (dlq replay) fails
        self._wait_for_scheduler = wait_for_scheduler
        self.method = SUBMIT  # the submit method of this client's wire version

    def submit(self, items: list[Item]) -> PendingCall:
        """Start a submit call for one batch; :meth:`PendingCall.result` waits for it."""
        return PendingCall(self, items, encode_items(items))

    def submit_encoded(self, payload: bytes, count: int,
                       spread: str | None = None) -> PendingCall:
        """Start a submit call for a batch already encoded (see :class:`wire.Columns`).
        The calls of one ``spread`` key (a binding) go round the live schedulers in turn,
        so that every scheduler holds work of every busy binding and tenant (and so serves
        the tenants by their weights)."""
        return PendingCall(self, None, payload, count, spread)

    def open_stream(self, first: bytes, items: Sequence[Any],
                    events: Events) -> StreamCall | None:
        """Open a run stream for one batch (:mod:`asynctier.platform.stream`) on a live
        scheduler; None when none is known (the caller waits and tries again)."""
        address = self._pick()
        if address is None:
            known = list(self._addresses())
            if not known:
                self._no_scheduler()
                return None
            address = known[next(self._rr) % len(known)]
        self._stub(address)
        with self._lock:
            channel = self._channels[address][0]
        stub = channel.stream_stream(RUN_STREAM, request_serializer=None,
                                     response_deserializer=None)
        return StreamCall(address, stub, first, events, items)

    def stream_failed(self, call: StreamCall, code: grpc.StatusCode | None,
                      error: str) -> None:
        """A run stream broke: leave its scheduler alone for a while (as a failed call)."""
        if code == grpc.StatusCode.UNIMPLEMENTED:
            log.error("scheduler %s has no run stream of version %s (%s): run the same "
                      "asynctier version on tailers and schedulers", call.address,
                      STREAM_VERSION, error)
            self._mark_down(call.address, WRONG_WIRE_BACKOFF_S, close=False)
        elif code != grpc.StatusCode.CANCELLED:  # a dead scheduler's channel is no good
            self._mark_down(call.address, close=code == grpc.StatusCode.UNAVAILABLE)

    def _pick(self, spread: str | None = None) -> str | None:
        now = time.monotonic()
        if self._place is not None:
            live = list(self._place({a for a, until in list(self._down.items())
                                     if until > now}))
        else:
            live = [a for a in self._addresses() if self._down.get(a, 0.0) <= now]
        if not live:
            return None
        turn = self._rr if spread is None else self._rr_by.setdefault(spread,
                                                                     itertools.count())
        return live[next(turn) % len(live)]

    def _send(self, payload: bytes, spread: str | None = None,
              resent: bool = False) -> tuple[str, Any]:
        """Send a submit call (``resent``: a copy of it may have reached a scheduler, so
        none of its items is fresh, see :data:`RESENT`)."""
        address = self._pick(spread)
        if address is None:  # everyone is marked down: try the first known one anyway
            known = list(self._addresses())
            if not known:
                if not self._wait_for_scheduler:
                    raise SchedulerUnavailable(f"{NO_SCHEDULER}: {NO_SCHEDULER_HINT}")
                return "", self._no_scheduler()
            address = known[next(self._rr) % len(known)]
        return address, self._stub(address).future(
            payload, timeout=self._timeout, wait_for_ready=False,
            metadata=RESENT if resent else None)

    def _no_scheduler(self) -> Future[bytes]:
        """A call that failed at once: no scheduler to send it to (the caller waits and
        sends it again; a tailer must not stop for good because none is up yet)."""
        now = time.monotonic()
        if now - self._no_scheduler_logged >= NO_SCHEDULER_LOG_EVERY_S:
            self._no_scheduler_logged = now
            log.error("%s: batches wait until one registers in Redis; %s", NO_SCHEDULER,
                      NO_SCHEDULER_HINT)
        failed: Future[bytes] = Future()
        failed.set_exception(NoScheduler())
        return failed

    def _stub(self, address: str) -> Any:
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                channel = open_channel(address, self.security, CHANNEL_OPTIONS)
                stub = channel.unary_unary(self.method, request_serializer=None,
                                           response_deserializer=None)
                entry = self._channels[address] = (channel, stub)
            return entry[1]

    def _not_our_wire(self, address: str, exc: grpc.RpcError) -> None:
        """``address`` has no submit method of this wire version: leave it alone for a
        while, and say so (at most every :data:`WRONG_WIRE_LOG_EVERY_S` per scheduler). Its
        channel stays open: other calls on it get the same answer, not a cancellation."""
        now = time.monotonic()
        if now - self._wrong_wire_logged.get(address, -WRONG_WIRE_LOG_EVERY_S) \
                >= WRONG_WIRE_LOG_EVERY_S:
            self._wrong_wire_logged[address] = now
            detail = (exc.details() if hasattr(exc, "details") else None) or str(exc)
            if "wire version" in detail:  # an asynctier scheduler of another version
                log.error("scheduler %s does not speak this tailer's wire version %s (it "
                          "says: %s); batches wait for a scheduler that does, no attempt "
                          "spent. Run the same asynctier version on tailers and "
                          "schedulers.", address, WIRE_VERSION, detail)
            else:
                log.error("%s answered UNIMPLEMENTED (%s): it has no submit call of wire "
                          "version %s. Is it an older asynctier scheduler (upgrade it), or "
                          "another service at that address (check the scheduler list)? "
                          "Batches wait for a scheduler that takes them, no attempt spent.",
                          address, detail, WIRE_VERSION)
        self._mark_down(address, WRONG_WIRE_BACKOFF_S, close=False)

    def bad_reply(self, address: str, count: int, exc: BadReply) -> None:
        """``address`` answered a batch of ``count`` item(s) with a reply that fails the
        checks: say so, and leave it alone for a while (as a failed call)."""
        log.error("scheduler %s sent a bad answer to a batch of %d item(s): %s. Nothing is "
                  "done on its word: the batch is sent again. Check that %s is an asynctier "
                  "scheduler of this version (asynctier schedulers) and read its log.",
                  address, count, exc, address)
        self._mark_down(address, 2.0, close=False)

    def _mark_down(self, address: str, for_s: float = 2.0, close: bool = True) -> None:
        self._down[address] = max(self._down.get(address, 0.0), time.monotonic() + for_s)
        if not close:
            return
        with self._lock:
            entry = self._channels.pop(address, None)
        if entry is not None:
            entry[0].close()

    def _wait_for_one(self, stop: threading.Event | None) -> None:
        """Back off briefly before resending (a bounded wait, interruptible by ``stop``)."""
        now = time.monotonic()
        delay = 0.2 if any(self._down.get(a, 0.0) <= now for a in self._addresses()) else 1.0
        if stop is not None:
            stop.wait(delay)
        else:
            time.sleep(delay)

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            for channel, _ in self._channels.values():
                channel.close()
            self._channels.clear()
