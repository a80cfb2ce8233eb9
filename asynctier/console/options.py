"""How the console runs: where it listens, who may use it, whether it may act."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from asynctier.platform.errors import AsynctierError

#: The console's address unless ``--listen`` says otherwise.
DEFAULT_LISTEN = "127.0.0.1:8089"
#: A token shorter than this is refused: it would be guessed.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ConsoleOptions:
    """The console's settings; :meth:`check` refuses unsafe ones."""

    listen: str = DEFAULT_LISTEN
    #: The secret an operator logs in with (or sends as ``Authorization: Bearer``).
    token: str | None = None
    #: No login at all: only when listening on a loopback address.
    insecure_local: bool = False
    #: Show everything, offer no action, refuse every action posted.
    read_only: bool = False
    #: How often the console samples lag and throughput, and how long it keeps them.
    sample_every_s: float = 5.0
    keep_samples_s: float = 6 * 3600.0

    def host_port(self) -> tuple[str, int]:
        """``listen`` split; AsynctierError when it is not ``host:port``."""
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise AsynctierError(f"console: --listen {self.listen!r} is not host:port "
                                 f"(such as {DEFAULT_LISTEN})")
        return host.strip("[]"), int(port)

    def check(self) -> ConsoleOptions:
        """Refuse a console anyone could use: no token without ``insecure_local``, and
        ``insecure_local`` on loopback only."""
        host, _ = self.host_port()
        if self.insecure_local:
            if not _loopback(host):
                raise AsynctierError(
                    f"console: --insecure-local serves without a login, so it listens on "
                    f"loopback only, not on {host!r}: give --token (or "
                    "ASYNCTIER_CONSOLE_TOKEN) to listen there")
        elif not self.token:
            raise AsynctierError("console: give a login token (--token or "
                                 "ASYNCTIER_CONSOLE_TOKEN), or --insecure-local on loopback")
        elif len(self.token) < MIN_TOKEN_CHARS:
            raise AsynctierError(f"console: the token has {len(self.token)} characters; "
                                 f"give at least {MIN_TOKEN_CHARS} (for example `openssl "
                                 "rand -hex 16`)")
        if not 0.5 <= self.sample_every_s <= 3600 or self.keep_samples_s < self.sample_every_s:
            raise AsynctierError("console: sample every 0.5 s to 1 h, and keep samples at "
                                 "least that long")
        return self


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
