"""Checks on a workload before anything is stored: each refusal says what to fix.

The rules are the binding's own: its payload format (decoded by the scheduler's decoder,
:func:`~asynctier.platform.payloads.decoder_for`), and for a queue binding the
queue's limits (:mod:`asynctier.queue.items`: priority range, id format, delays).
"""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.platform.errors import DecodeError, QueueError, SchemaRegistryUnavailable
from asynctier.platform.framed import RegistryClients
from asynctier.platform.payloads import Decoder, decoder_for
from asynctier.queue.items import (
    MAX_DELAY_S,
    MAX_PAYLOAD_BYTES,
    check_id,
    check_priority,
    check_topic,
)
from asynctier.submitter.protocol import Workload

#: The largest payload the Submitter takes by default (1 MiB, the queue's own limit).
DEFAULT_MAX_PAYLOAD_BYTES = MAX_PAYLOAD_BYTES
MAX_HEADER_NAME = 256
#: The most parents one workload may wait for (a fan-in of more: a tree of joins).
MAX_PARENTS = 10_000


class Validator:
    """Checks the workloads of one binding (its decoder is built once)."""

    def __init__(self, binding: Binding, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 registries: RegistryClients | None = None) -> None:
        self.binding = binding
        self.max_payload_bytes = binding.payload.max_bytes or max_payload_bytes
        self._decode: Decoder = decoder_for(binding, registries)
        self._queue = binding.source.kind == "queue"

    def problem(self, w: Workload) -> str | None:
        """Why ``w`` cannot be accepted, or None when it can."""
        return (self._payload_problem(w) or self._fields_problem(w)
                or _headers_problem(w.headers))

    def _payload_problem(self, w: Workload) -> str | None:
        if w.payload is None:
            return "the payload is missing: give the workload's bytes"
        if len(w.payload) > self.max_payload_bytes:
            return (f"the payload is {len(w.payload):,} bytes, over the "
                    f"{self.max_payload_bytes:,}-byte limit of binding {self.binding.name}: "
                    "store big inputs elsewhere and submit their address")
        try:
            self._decode(w.payload)
        except SchemaRegistryUnavailable:
            return None  # not the payload's fault: the scheduler decodes it again, retrying
        except DecodeError as exc:
            return (f"the payload does not decode as the binding's format "
                    f"({self.binding.payload.format}): {exc}")
        return None

    def _fields_problem(self, w: Workload) -> str | None:
        name = self.binding.name
        if not self._queue:
            for given, what in ((w.priority, "priority"), (w.delay_ms, "delay"),
                                (w.id, "id"), (w.after or None, "parent (after)"),
                                (w.on_parent_failure, "on_parent_failure")):
                if given is not None:
                    return (f"binding {name} reads a Kafka topic: a {what} applies to queue "
                            f"bindings only; leave it out")
            return None
        if w.key is not None:
            return (f"binding {name} reads a queue topic: a key applies to Kafka bindings "
                    "only; leave it out (use id to name the item)")
        try:
            if w.priority is not None:
                check_priority(w.priority)
            if w.id is not None:
                check_id(w.id)
            for topic, ident in w.after:
                check_topic(topic or self.binding.source.topic, "parent: ")
                check_id(ident, "parent: ")
        except QueueError as exc:
            return str(exc)
        if len(w.after) > MAX_PARENTS:
            return (f"{len(w.after):,} parents, over the {MAX_PARENTS:,} one workload may "
                    "wait for: join them in steps (children of parts, then one child of those)")
        own = self.binding.source.topic
        if w.id is not None and any((t or own, i) == (own, w.id) for t, i in w.after):
            return f"it names itself ({w.id!r}) as its parent"
        if w.delay_ms is not None and not 0 <= w.delay_ms <= MAX_DELAY_S * 1000:
            return (f"delay {w.delay_ms / 1000:g}s is out of range: give seconds from 0 to "
                    f"{MAX_DELAY_S:g} (365 days)")
        return None


def _headers_problem(headers: tuple[tuple[str, bytes | None], ...]) -> str | None:
    for name, _ in headers:
        if not name or len(name) > MAX_HEADER_NAME or not name.isprintable():
            return (f"header name {name[:40]!r} is not valid: give 1 to {MAX_HEADER_NAME} "
                    "printable characters")
        if name.startswith("asynctier."):
            return (f"header {name!r}: names starting 'asynctier.' are the platform's; "
                    "choose another name")
    return None
