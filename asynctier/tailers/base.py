"""The tailer contract: what every source's tailer does, whatever the source.

A tailer watches one source for one binding, reads batches, turns each record into a
:class:`~asynctier.platform.wire.Item`, pushes the batch to a scheduler with the one
generic call ``submit(items) -> outcomes``, resolves every outcome (success, or a hand-off
to a delay or dead-letter topic), and only then checkpoints its position. A Kafka topic is
the first source (:mod:`asynctier.tailers.kafka`); a queue with leases or files would fit
the same contract.
"""

from __future__ import annotations

import threading
from typing import Protocol

from asynctier.platform.binding import Binding


class Tailer(Protocol):
    """One binding's reader of one source."""

    binding: Binding

    def run(self, stop: threading.Event) -> None:
        """Read, submit, resolve and checkpoint until ``stop`` is set; then finish the
        batches under way, checkpoint them and return."""
        ...
