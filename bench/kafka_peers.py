"""The Kafka-native Python peers (issue 30): one worker process of Quix Streams or of
faust-streaming, run as::

    python -m bench.kafka_peers quix|faust BOOTSTRAP TOPIC GROUP WORK STATE_DIR

``WORK`` is ``noop``, ``sleep`` or ``asleep`` (:mod:`bench.work`). Two such processes in one
consumer group drain the topic (each takes half of its partitions), as asynctier gets two
working processes (tailer and scheduler). Both peers are at-least-once: an offset is
committed after its record was processed.

- **Quix Streams**: an ``Application`` (``processing_guarantee="at-least-once"``,
  ``commit_interval`` :data:`COMMIT_INTERVAL_S`, changelog topics off: no state), a
  dataframe over the topic (JSON values) with ``.update(work)``. Quix calls its functions
  one record at a time and has no async form: the async work runs on one event loop of the
  process, ``loop.run_until_complete`` per record.
- **faust-streaming**: an app with one agent over the topic (raw values, decoded with
  ``json.loads``; agent concurrency 1, the default), ``broker_commit_interval``
  :data:`COMMIT_INTERVAL_S`, in-memory store, no web server. The sync work is called as is
  inside the agent (it blocks the loop, as a sync call in an agent does); the async one is
  awaited.

Each worker, once imported and built, writes ``STATE_DIR.ready`` and waits for the file
``STATE_DIR/../go`` before it joins the group: the two join together, whatever their import
times on a loaded machine.

Both commit every :data:`COMMIT_INTERVAL_S` instead of their defaults (Quix 5 s, faust
2.8 s), so that the drain's end is seen as soon as asynctier's is (it commits per batch).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from bench.kafka_loops import noop
from bench.work import asleep_1ms, sleep_1ms

#: How often both peers commit, in seconds (asynctier commits each batch once resolved).
COMMIT_INTERVAL_S = 0.5
#: How long a worker waits for the go file before it gives up.
GO_TIMEOUT_S = 180.0


def ready_then_wait(state_dir: str) -> None:
    """Say this worker is ready (``STATE_DIR.ready``), then wait for ``STATE_DIR/../go``."""
    Path(f"{state_dir}.ready").touch()
    go = Path(state_dir).parent / "go"
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench peer worker: no {go} after {GO_TIMEOUT_S:g} s")
        time.sleep(0.01)


def run_quix(bootstrap: str, topic: str, group: str, work: str, state_dir: str) -> None:
    """One Quix Streams worker until it is stopped (SIGTERM)."""
    from quixstreams import Application

    app = Application(broker_address=bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", commit_interval=COMMIT_INTERVAL_S,
                      processing_guarantee="at-least-once", use_changelog_topics=False,
                      auto_create_topics=False, state_dir=state_dir, loglevel="WARNING")
    sdf = app.dataframe(app.topic(topic, value_deserializer="json"))
    if work == "noop":
        sdf = sdf.update(noop)
    elif work == "sleep":
        sdf = sdf.update(sleep_1ms)
    else:
        loop = asyncio.new_event_loop()

        def run_async(value: Any) -> None:
            loop.run_until_complete(asleep_1ms(value))

        sdf = sdf.update(run_async)
    ready_then_wait(state_dir)
    app.run()


def run_faust(bootstrap: str, topic: str, group: str, work: str, state_dir: str) -> None:
    """One faust-streaming worker until it is stopped (SIGTERM)."""
    import faust

    app = faust.App(group, broker=f"kafka://{bootstrap}", store="memory://",
                    broker_commit_interval=COMMIT_INTERVAL_S, web_enabled=False,
                    topic_allow_declare=False, topic_disable_leader=True,
                    consumer_auto_offset_reset="earliest", datadir=state_dir)
    source = app.topic(topic, value_type=bytes, value_serializer="raw")
    loads = json.loads

    if work == "asleep":
        async def agent(stream: Any) -> None:
            async for value in stream:
                await asleep_1ms(loads(value))
    else:
        call = noop if work == "noop" else sleep_1ms

        async def agent(stream: Any) -> None:
            async for value in stream:
                call(loads(value))

    app.agent(source, name="bench-agent")(agent)
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    ready_then_wait(state_dir)
    app.main()


PEERS = {"quix": run_quix, "faust": run_faust}


def main(argv: list[str]) -> None:
    """``quix|faust BOOTSTRAP TOPIC GROUP WORK STATE_DIR``."""
    kind, bootstrap, topic, group, work, state_dir = argv
    logging.basicConfig(level=logging.WARNING)
    PEERS[kind](bootstrap, topic, group, work, state_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
