"""An acknowledged enqueue is durable: PostgreSQL SIGKILLed while a writer enqueues loses
none of the items whose enqueue had returned (the ack comes only after the commit)."""

from __future__ import annotations

import threading
from pathlib import Path

from asynctier import dev
from asynctier.queue.items import NewItem
from asynctier.queue.store import QueueStore
from tests.helpers import wait_until


def test_every_acked_enqueue_survives_a_sigkill_of_postgresql(
        tmp_path: Path, queue_namespace: str) -> None:
    node = dev.start_test_postgres(tmp_path / "own")
    store = QueueStore(node.dsn, timeout_s=2.0)
    acked: list[str] = []
    stop = threading.Event()

    def writer() -> None:  # one item a call, as fast as the server acks them
        n = 0
        while not stop.is_set():
            item_id = f"w{n}"
            n += 1
            try:
                store.enqueue(queue_namespace, [NewItem("durable", b"{}", id=item_id)])
            except Exception:  # not acked (the server went away): it may or may not be there
                continue
            acked.append(item_id)

    try:
        store.migrate()
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        wait_until(lambda: len(acked) >= 300, 60, "enqueues acked")
        assert node.kill()  # SIGKILL, between two acks or inside a commit
        killed_at = len(acked)
        stop.set()
        thread.join(30)
        node.start()  # recovery from the WAL
        reader = QueueStore(node.dsn)
        try:
            missing = [i for i in acked if reader.get(queue_namespace, "durable", i) is None]
        finally:
            reader.close()
        assert not missing, f"{len(missing)} acked item(s) lost, such as {missing[:5]}"
        assert len(acked) >= killed_at >= 300
    finally:
        stop.set()
        store.close()
        node.stop()
