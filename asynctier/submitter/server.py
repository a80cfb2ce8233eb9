"""The Submitter process: SubmitWorkloads on a ``grpc.aio`` server, graceful stop.

Stop: new calls get UNAVAILABLE (clients move to another Submitter), calls under way
finish within ``stop_grace_s`` (each answers only after its write is durable), then the
producer delivers what is left and the stores close.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc

from asynctier.platform import eventloop
from asynctier.platform.binding_source import BindingSource, FollowedBindings
from asynctier.platform.config import Settings
from asynctier.platform.framed import RegistryClients
from asynctier.platform.redis_client import async_client
from asynctier.platform.rpcsecurity import add_port, server_interceptors
from asynctier.platform.rpcserver import SERVER_OPTIONS, advertised
from asynctier.queue.shards import ShardedQueue
from asynctier.submitter.backlog import Backlog
from asynctier.submitter.capacity import EnqueueCapacity
from asynctier.submitter.protocol import METHOD
from asynctier.submitter.service import Submitter, SubmitterOptions
from asynctier.submitter.writers import KafkaWriter

log = logging.getLogger(__name__)

#: Calls a Submitter serves at once at most.
MAX_CALLS = 512
#: How long a stopping Submitter lets the calls under way finish.
STOP_GRACE_S = 30.0


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, submitter: Submitter) -> None:
        self._method = grpc.unary_unary_rpc_method_handler(
            submitter.handle, request_deserializer=None, response_serializer=None)

    def service(self, handler_call_details: Any) -> Any:
        return self._method if handler_call_details.method == METHOD else None


def run_submitter(settings: Settings, *, listen: str | None = None,
                  stop: threading.Event | None = None,
                  options: SubmitterOptions | None = None,
                  ready_callback: Callable[[str], None] | None = None,
                  stop_grace_s: float = STOP_GRACE_S) -> None:
    """Run a Submitter until ``stop`` is set; blocks."""
    eventloop.run(serve_submitter(settings, listen=listen, stop=stop or threading.Event(),
                                options=options, ready_callback=ready_callback,
                                stop_grace_s=stop_grace_s))


async def serve_submitter(settings: Settings, *, listen: str | None, stop: threading.Event,
                          options: SubmitterOptions | None = None,
                          ready_callback: Callable[[str], None] | None = None,
                          stop_grace_s: float = STOP_GRACE_S,
                          bindings: BindingSource | None = None,
                          capacity_clock: Callable[[], int] | None = None) -> None:
    """:func:`run_submitter` as a coroutine (``capacity_clock``: see
    :class:`~asynctier.submitter.capacity.EnqueueCapacity`)."""
    options = options or SubmitterOptions()
    listen = listen or settings.submitter_listen
    if bindings is None:
        followed = FollowedBindings(settings)
        await asyncio.to_thread(followed.start)
        bindings = followed
    queue = ShardedQueue.from_settings(settings, pool_size=8)
    kafka = KafkaWriter(settings)
    redis = async_client(settings.redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
    backlog = (None if options.max_backlog is None
               else Backlog(settings, queue, options.max_backlog, options.backlog_recheck_s))
    capacity = EnqueueCapacity(redis, settings.names, capacity_clock)
    submitter = Submitter(bindings, queue, kafka, capacity, backlog, options,
                          RegistryClients(settings.schema_registry))
    # calls past MAX_CALLS are refused RESOURCE_EXHAUSTED by gRPC before their bytes are
    # read: with max_pending, what a flood of calls can hold in memory is bounded
    server = grpc.aio.server(options=SERVER_OPTIONS, maximum_concurrent_rpcs=MAX_CALLS,
                             interceptors=server_interceptors(settings.rpc))
    server.add_generic_rpc_handlers((_Handler(submitter),))
    try:
        port = add_port(server, listen, settings.rpc, "Submitter")
        await server.start()
        address = advertised(listen, port)
        log.info("submitter listening on %s (port %d, %s); at most %d workloads under way, "
                 "backlog cap %s", listen, port, settings.rpc.describe(), options.max_pending,
                 options.max_backlog or "none")
        if ready_callback is not None:
            ready_callback(address)
        while not stop.is_set():
            await asyncio.sleep(0.1)
        log.info("submitter %s stopping: finishing the calls under way (at most %gs)",
                 address, stop_grace_s)
        await server.stop(stop_grace_s)
        if submitter.group is not None and submitter.group.calls:
            log.info("submitter %s: %d queue items written in %d group commits", address,
                     submitter.group.items, submitter.group.calls)
    finally:
        if backlog is not None:
            await asyncio.to_thread(backlog.close)
        await asyncio.to_thread(kafka.close)
        queue.close()
        bindings.close()
        await redis.aclose()
        log.info("submitter stopped")
