"""Children forked by the test process while gRPC's threads run start cleanly.

A child that runs as another user (PostgreSQL's tools as user postgres) is forked, not
vforked, and gRPC's fork handlers could crash it before its exec (a CI run lost a
standby's pg_basebackup so). tests/conftest.py turns those handlers off before gRPC
loads; this fails if they come back.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import threading
from concurrent import futures

import grpc
import pytest


# The readiness poller's own thread may call once more into the channel closed at the end.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_children_forked_beside_a_busy_channel_all_start() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a child as another user")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user to start a child as")
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stop = threading.Event()

    def busy() -> None:  # keeps gRPC's threads working while the children fork
        while not stop.is_set():
            ready = grpc.channel_ready_future(channel)
            with contextlib.suppress(grpc.FutureTimeoutError):
                ready.result(timeout=0.01)
            ready.cancel()

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    failed = []
    try:
        for _ in range(200):
            done = subprocess.run(["/bin/true"], capture_output=True, text=True,
                                  user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                                  check=False)
            if done.returncode != 0:
                failed.append((done.returncode, done.stderr[:200]))
    finally:
        stop.set()
        thread.join(5)
        channel.close()
        server.stop(None)
    assert not failed, f"{len(failed)} of 200 children failed to start: {failed[:3]}"
