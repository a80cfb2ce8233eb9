"""The worker process of ``--isolation process`` bindings: runs one item at a time.

Started by :class:`~asynctier.scheduler.processes.ProcessPool` as ``python -m
asynctier.scheduler.worker_main ALLOW_JSON NICE`` (NICE: added to its niceness first).
It reads requests on stdin and answers on the stdout it had at start; the function's own
prints go to stderr (the scheduler's log). Every message is data: JSON and raw bytes in
length-prefixed frames, never pickle. A request is three frames (the item's context as
JSON, the binding as its Avro record, the payload). The answer is an empty frame when
the function starts (its module imported and the payload decoded: the scheduler's clock
for the timeout starts there), then any checkpoint frames (``ctx.checkpoint``: each
waits for the scheduler's reply on stdin), then one frame, the item's outcome as JSON.

The function is resolved here with the scheduler's allowed modules
(:class:`~asynctier.scheduler.resolver.FunctionResolver`): a module not allowed
is refused in the worker as it is in the scheduler, before anything is imported.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from asynctier.platform import tracing
from asynctier.platform.binding import Binding
from asynctier.platform.context import Context, decode_checkpoint
from asynctier.platform.errors import (
    CheckpointError,
    DecodeError,
    FunctionNotFound,
    ModuleNotAllowed,
)
from asynctier.platform.framed import RegistryClients
from asynctier.platform.payloads import Decoder, decoder_for
from asynctier.platform.tracing import TracingSettings
from asynctier.platform.wire import FUNCTION_ERROR, Outcome, failed, ok
from asynctier.scheduler import outcomes
from asynctier.scheduler.frames import CHECKPOINT, frame, read_frame
from asynctier.scheduler.resolver import FunctionResolver

#: The worker's ``[schema_registry]`` settings (JSON), for registry-framed bindings: in its
#: environment, not on its command line, since they may hold credentials.
REGISTRY_CONFIG_ENV = "ASYNCTIER_WORKER_SCHEMA_REGISTRY"
#: The scheduler's ``[tracing]`` settings (JSON) while tracing is on: the worker's runs are
#: spans of the same trace as the attempt, exported by the worker.
TRACING_ENV = "ASYNCTIER_WORKER_TRACING"


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class PipeSaver:
    """``ctx.checkpoint`` in a worker: the state goes to the scheduler, which saves it as
    for a thread, and the call returns once the scheduler says it is durable."""

    def __init__(self, answers: IO[bytes], requests: IO[bytes]) -> None:
        self.answers = answers
        self.requests = requests

    def save(self, state: bytes, kind: str) -> None:
        """Send the state and wait for the scheduler's reply."""
        self.answers.write(frame(CHECKPOINT + kind.encode() + b"\n" + state))
        reply = read_frame(self.requests)
        if reply is None:
            raise CheckpointError("the scheduler went away before the checkpoint was saved")
        if reply:
            raise CheckpointError(reply.decode("utf-8", "replace"))

    async def asave(self, state: bytes, kind: str) -> None:
        """:meth:`save` (a worker runs sync functions: nothing else runs meanwhile)."""
        self.save(state, kind)


class Worker:
    """Runs the items it is sent, with the functions of allowed modules only."""

    def __init__(self, allow_modules: list[str],
                 registries: RegistryClients | None = None) -> None:
        self.resolver = FunctionResolver(allow_modules)
        self.registries = registries or RegistryClients()
        self._bindings: dict[bytes, tuple[Binding, Decoder]] = {}

    def binding(self, data: bytes) -> tuple[Binding, Decoder]:
        """The binding (and its decoder) of a request, decoded once per version."""
        found = self._bindings.get(data)
        if found is None:
            binding = Binding.decode(data)
            found = self._bindings[data] = (binding, decoder_for(binding, self.registries))
        return found

    def run(self, doc: dict[str, Any], binding_data: bytes, payload: bytes,
            started: Callable[[], None] = lambda: None,
            saver: PipeSaver | None = None) -> Outcome:
        """The outcome of one item; ``started()`` is called just before the function."""
        item_id = int(doc["id"])
        binding, decode = self.binding(binding_data)
        try:
            function = self.resolver.resolve(binding.function)
        except (ModuleNotAllowed, FunctionNotFound) as exc:
            return failed(item_id, str(exc), FUNCTION_ERROR)
        try:
            value = decode(payload)
        except DecodeError as exc:
            return outcomes.undecodable(item_id, exc)
        headers = tuple((name, _bytes(value)) for name, value in doc["headers"])
        resumed = doc.get("resumed")
        ctx = Context(binding.name, _bytes(doc["key"]), headers, doc["source"],
                      int(doc["attempt"]), float(doc["record_time"]),
                      time.time() + binding.execution.timeout_s, binding.tenant,
                      None if resumed is None else decode_checkpoint(_bytes(resumed["data"]),
                                                                     resumed["kind"]),
                      saver if doc.get("checkpoints") else None)
        if doc.get("trace") and tracing.enabled():
            from asynctier.scheduler.traces import context_of_traceparent, traced

            ctx.trace = context_of_traceparent(doc["trace"])
            function = traced(function)
        started()
        try:
            function.call(value, ctx)
        except BaseException as exc:  # a function may raise anything, even SystemExit
            return outcomes.of_exception(item_id, exc)
        return ok(item_id)


def main(argv: list[str]) -> None:
    """Serve requests on stdin until it closes."""
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # the function's prints go to the log, not into the answers
    requests = sys.stdin.buffer
    if len(argv) > 2 and int(argv[2]) > 0:
        os.nice(int(argv[2]))
    registry_config = json.loads(os.environ.get(REGISTRY_CONFIG_ENV, "{}"))
    if os.environ.get(TRACING_ENV):
        tracing.start(TracingSettings(**json.loads(os.environ[TRACING_ENV])), "worker")
    worker = Worker(json.loads(argv[1]) if len(argv) > 1 else [],
                    RegistryClients(registry_config))
    while True:
        header = read_frame(requests)
        binding_data = read_frame(requests) if header is not None else None
        payload = read_frame(requests) if binding_data is not None else None
        if header is None or binding_data is None or payload is None:
            return
        def started() -> None:
            answers.write(frame(b""))

        outcome = worker.run(json.loads(header), binding_data, payload, started,
                             PipeSaver(answers, requests))
        answers.write(frame(json.dumps(outcome).encode()))


if __name__ == "__main__":
    main(sys.argv)
