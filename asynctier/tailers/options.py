"""A Kafka tailer's knobs, apart from the tailer (the command line builds them without
loading the Kafka client)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TailerOptions:
    """Knobs of a Kafka tailer."""

    batch_size: int = 1000
    max_in_flight: int = 4
    idle_poll_s: float = 0.5
    linger_s: float = 0.005
    handoff_retry_s: float = 1.0
    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 300_000
