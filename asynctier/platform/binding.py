"""A binding: one source bound to one Python function, with its settings grouped by feature
(:mod:`asynctier.platform.binding_features`).

Bindings are checked when bound (:meth:`Binding.validate`) and stored as Avro
(``schemas/binding.avsc``) in the compacted bindings topic. The stored record keeps its flat
fields (only the source is nested), so the groups are a view of the same bytes. A bad
binding raises :class:`BindingError` whose message names the field and says what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from asynctier.platform.allowlist import FUNCTION_PATH_RE
from asynctier.platform.binding_features import (
    Breaker,
    Deadlines,
    Execution,
    Limits,
    Payload,
    Retries,
    Source,
    check,
)
from asynctier.platform.schemas import decode_stored, encode_stored, load_schema

Priority = Literal["urgent", "normal", "batch"]
PRIORITIES: tuple[Priority, ...] = ("urgent", "normal", "batch")
#: The CPU niceness of a tier's work, above the platform's own: its worker processes and
#: its tailers process under ``asynctier run``. The kernel weighs nice 0, 3 and 9 as 1024,
#: 526 and 137, about the 8:4:1 the tiers share the workers in.
NICENESS: dict[str, int] = {"urgent": 0, "normal": 3, "batch": 9}

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def is_binding_name(name: str) -> bool:
    """Whether ``name`` could name a binding (and so a dead-letter topic)."""
    return _NAME_RE.fullmatch(name) is not None


_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class Binding:
    """A source (a Kafka topic, or a queue topic) bound to a function (docs/design.md,
    Contracts: Binding): who it is (name, function, tenant, priority, created time) and
    its settings, one group per feature."""

    name: str
    source: Source
    function: str
    tenant: str = "default"
    priority: Priority = "normal"
    payload: Payload = field(default_factory=Payload)
    limits: Limits = field(default_factory=Limits)
    retries: Retries = field(default_factory=Retries)
    breaker: Breaker = field(default_factory=Breaker)
    execution: Execution = field(default_factory=Execution)
    deadlines: Deadlines = field(default_factory=Deadlines)
    created_ms: int = 0
    #: Bound by a release whose tailers raise the sent marks (docs/design.md, Run once off
    #: the path): a partition of it without a mark was never sent from.
    fresh_from_start: bool = False

    @property
    def module(self) -> str:
        """The module part of ``function``."""
        return self.function.partition(":")[0]

    @property
    def moved_to_queue(self) -> bool:
        """True for a Kafka binding whose timeout is above its ``queue_after_s``: its
        records are moved into a queue topic the platform owns
        (:meth:`~asynctier.platform.names.Names.moved_topic`) and run from there
        (docs/design.md, Long work on Kafka records)."""
        return (self.source.kind == "kafka"
                and self.execution.timeout_s > self.source.queue_after_s)

    def moved_binding(self, queue_topic: str) -> Binding:
        """The queue binding the moved records run under: the same name, function and
        limits, its source the queue topic ``queue_topic`` (with this binding's lease)."""
        return self.with_changes(source=replace(self.source, kind="queue", topic=queue_topic))

    def with_changes(self, **changes: Any) -> Binding:
        """A copy with some fields changed: identity fields, or whole groups, such as
        ``b.with_changes(limits=replace(b.limits, rate_per_s=5.0))``."""
        return replace(self, **changes)

    # -- checking -------------------------------------------------------------------------

    def validate(self) -> Binding:
        """Return self if every field is acceptable, else raise BindingError saying why."""
        check(_NAME_RE.fullmatch(self.name) is not None, "name",
              f"{self.name!r} is not a valid binding name: use 1-63 lower-case letters, "
              "digits, '-' or '_', starting with a letter or digit")
        self.source.validate()
        check(FUNCTION_PATH_RE.fullmatch(self.function) is not None, "function",
              f"{self.function!r} is not a function path: write module:attr, "
              "for example myapp.jobs:resize")
        check(_TENANT_RE.fullmatch(self.tenant) is not None, "tenant",
              f"{self.tenant!r} is not a valid tenant: letters, digits, '.', '-', '_'")
        check(self.priority in PRIORITIES, "priority",
              f"priority {self.priority!r} is not one of {', '.join(PRIORITIES)}")
        for group in (self.payload, self.execution, self.limits, self.retries, self.breaker,
                      self.deadlines):
            group.validate()
        self._validate_ordering()
        return self

    def _validate_ordering(self) -> None:
        """Per-key order runs from the Kafka topic: neither a queue nor moved records."""
        if self.execution.ordering == "none":
            return
        check(self.source.kind == "kafka", "ordering",
              "--ordering key is for a Kafka topic; a queue orders by priority")
        check(not self.moved_to_queue, "ordering",
              f"--ordering key runs from the Kafka topic, but a timeout of "
              f"{self.execution.timeout_s:g}s (over --queue-after "
              f"{self.source.queue_after_s:g}s) moves the records into the queue, where "
              "order is not kept: lower --timeout or raise --queue-after")

    # -- storage --------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """The Avro record of ``schemas/binding.avsc``: the groups' fields side by side,
        under their stored names, the source nested."""
        doc: dict[str, Any] = {"name": self.name, "source": _flat(self.source, "source"),
                               "function": self.function, "tenant": self.tenant,
                               "priority": self.priority, "created_ms": self.created_ms,
                               "fresh_from_start": self.fresh_from_start}
        for group in _FLAT_GROUPS:
            doc.update(_flat(getattr(self, group), group))
        doc["retry_ladder_s"] = list(self.retries.ladder_s)
        return {f["name"]: doc[f["name"]] for f in load_schema("binding")["fields"]}

    def encode(self) -> bytes:
        """Avro bytes for the bindings topic."""
        return encode_stored("binding", self.to_record())

    @classmethod
    def decode(cls, data: bytes) -> Binding:
        """A binding from the bindings topic's Avro bytes."""
        doc: dict[str, Any] = decode_stored("binding", data)
        groups = {group: _grouped(kind, group, doc) for group, kind in _FLAT_GROUPS.items()}
        return cls(source=Source(**doc.pop("source")), **groups, **doc)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (the stored record), with the ladder spelt as ``30s,1m,...``."""
        doc = self.to_record()
        doc["retry_ladder"] = ",".join(self.retries.ladder_names)
        return doc


#: The groups stored as flat fields of the record, by their attribute on Binding.
_FLAT_GROUPS: dict[str, type[Any]] = {
    "payload": Payload, "limits": Limits, "retries": Retries, "breaker": Breaker,
    "execution": Execution, "deadlines": Deadlines}
#: A group field whose stored name is not its own: the record predates the groups.
_STORED_AS = {"payload.max_bytes": "max_payload_bytes", "retries.ladder_s": "retry_ladder_s",
              "breaker.ratio": "breaker_ratio", "breaker.window_s": "breaker_window_s"}


def _flat(group: Any, name: str) -> dict[str, Any]:
    """A group's fields under their stored names."""
    return {_STORED_AS.get(f"{name}.{f.name}", f.name): getattr(group, f.name)
            for f in fields(group) if f.init}


def _grouped(kind: type[Any], name: str, doc: dict[str, Any]) -> Any:
    """The group ``kind`` taken out of the flat record ``doc`` (its fields removed)."""
    return kind(**{f.name: doc.pop(_STORED_AS.get(f"{name}.{f.name}", f.name))
                   for f in fields(kind) if f.init})
