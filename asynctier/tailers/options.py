"""The tailers' knobs, apart from the tailers (the command line builds them without loading
the Kafka client)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PipelineOptions:
    """How a tailer pipeline batches and retries (any source)."""

    batch_size: int = 1000
    max_in_flight: int = 4
    idle_poll_s: float = 0.5
    linger_s: float = 0.005
    handoff_retry_s: float = 1.0


@dataclass
class TailerOptions(PipelineOptions):
    """Knobs of a binding's tailer: its pipeline's, and its Kafka consumer's."""

    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 300_000
