"""What every gRPC server of the platform shares (the scheduler's and the Submitter's):
its options and the address it tells its callers."""

from __future__ import annotations

import socket

from asynctier.platform.rpc import MAX_MESSAGE

#: Options of every server: messages as large as a call may be, keepalive pings allowed.
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),  # a second scheduler on a busy port is an error, not a twin
]


def advertised(listen: str, port: int) -> str:
    """The address tailers should use for a server listening on ``listen`` (real port)."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::", "*"):
        host = socket.gethostname()
    return f"{host}:{port}"
