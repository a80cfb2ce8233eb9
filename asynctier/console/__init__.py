"""The operator console: a web page over the same config, Redis, Kafka and PostgreSQL as
the CLI (``asynctier console``).

It shows every binding with its state, throughput, lag, retries in flight on its ladder and
dead letters, the components' health and a lag history it samples itself; it browses dead
letters and queue items; and its actions (replay dead letters, cancel a queue item, replay
dead items) are the library calls the CLI makes. See docs/console.md.
"""

from asynctier.console.app import create_app, serve
from asynctier.console.options import ConsoleOptions

__all__ = ["ConsoleOptions", "create_app", "serve"]
