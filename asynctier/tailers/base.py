"""What the manager runs: one tailer per binding, whatever its source.

A tailer drives its source with the loop of that source's contract
(:mod:`asynctier.tailers.source`): the pipeline for a source checkpointed in order (read
batches, send each to a scheduler, resolve every outcome the source's way, and only then
checkpoint, in order), long work for a leased one (each item resolved as it ends).
:mod:`asynctier.tailers.registry` says which tailer a binding's source kind gets.
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
