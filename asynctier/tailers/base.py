"""What the manager runs: one tailer per binding, whatever its source.

A tailer drives one :class:`~asynctier.tailers.source.Source` with the one pipeline
(:mod:`asynctier.tailers.pipeline`): read batches, push each to a scheduler with
``submit(items) -> outcomes``, resolve every outcome the source's way, and only then
checkpoint. :mod:`asynctier.tailers.registry` says which tailer a binding's source kind
gets.
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
