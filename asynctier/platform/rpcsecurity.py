"""TLS, mutual TLS and a shared token on the platform's own gRPC (scheduler, Submitter).

One place builds what every server and every client uses: :func:`add_port` (a server's
listening port, with its credentials and the warning for plaintext off loopback),
:func:`server_interceptors` (the token check) and :func:`open_channel` (a client's
channel). ``[rpc]`` in ``asynctier.toml`` (:class:`RpcSecurity`)::

    [rpc]
    ca = "certs/ca.pem"            # servers: the CA client certificates must be signed by;
                                   # clients: the CA the server's certificate is signed by
    cert = "certs/server.pem"      # this process's certificate (a client's: client.pem)
    key = "certs/server-key.pem"
    token = "..."                  # optional: a shared token instead of client certificates
    insecure = false               # true: plaintext, for loopback development

Modes: ``ca`` + ``cert`` + ``key`` on both sides is mutual TLS (recommended: a server
accepts only clients whose certificate the CA signed). With ``token`` the server needs no
client certificate but every call must carry the token (over TLS only). With nothing set,
plaintext is allowed on loopback only; ``insecure = true`` allows it anywhere (a warning
at start when a server listens off loopback).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from asynctier.platform.errors import ConfigError, ServiceError, refuse_unknown_keys

log = logging.getLogger(__name__)

#: The metadata key a token travels in (``authorization: Bearer <token>``).
TOKEN_HEADER = "authorization"
ENV = {"ca": "ASYNCTIER_RPC_CA", "cert": "ASYNCTIER_RPC_CERT", "key": "ASYNCTIER_RPC_KEY",
       "token": "ASYNCTIER_RPC_TOKEN", "insecure": "ASYNCTIER_RPC_INSECURE"}
KEYS = tuple(ENV)


def _setting(name: str) -> str:
    """How an operator names one setting: the file key and its environment variable."""
    return f"[rpc] {name} (env {ENV[name]})"


@dataclass(frozen=True)
class RpcSecurity:
    """How the platform's gRPC links are secured; see the module's docstring."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    token: str | None = field(default=None, repr=False)  # a secret: never in a repr or log
    insecure: bool = False

    @property
    def tls(self) -> bool:
        """True when any TLS material is configured."""
        return any(p is not None for p in (self.ca, self.cert, self.key))

    def check(self) -> RpcSecurity:
        """This value, or ConfigError naming the setting to fix."""
        if (self.cert is None) != (self.key is None):
            missing = "key" if self.key is None else "cert"
            raise ConfigError(f"{_setting('cert')} and {_setting('key')} go together: "
                              f"{_setting(missing)} is not set")
        if self.insecure and self.tls:
            raise ConfigError(f"{_setting('insecure')} = true and TLS files are both set; "
                              "choose one (remove insecure for TLS)")
        if self.token is not None and not self.tls:
            raise ConfigError(f"{_setting('token')} is set without TLS: a token over "
                              f"plaintext is readable on the network; set {_setting('ca')} "
                              "(clients) and cert/key (servers)")
        if self.token is not None and not self.token.strip():
            raise ConfigError(f"{_setting('token')} is empty")
        return self

    def describe(self) -> str:
        """The mode in words, for a start line (no secret)."""
        if not self.tls:
            return "plaintext (insecure)" if self.insecure else "plaintext (loopback only)"
        mode = "mutual TLS" if self.ca and self.cert and self.token is None else "TLS"
        return mode + (" + token" if self.token is not None else "")


def from_mapping(table: dict[str, Any], source: str) -> RpcSecurity:
    """``[rpc]`` of a config file (paths relative to the working directory)."""
    refuse_unknown_keys(table, KEYS, "rpc", source)
    insecure = table.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"{source}: [rpc] insecure must be true or false")
    token = table.get("token")
    return RpcSecurity(ca=_path(table.get("ca")), cert=_path(table.get("cert")),
                       key=_path(table.get("key")),
                       token=None if token is None else str(token),
                       insecure=insecure).check()


def with_env(security: RpcSecurity, env: dict[str, str] | Any) -> RpcSecurity:
    """``security`` with the ``ASYNCTIER_RPC_*`` variables applied."""
    changes: dict[str, Any] = {}
    for name in ("ca", "cert", "key"):
        if env.get(ENV[name]):
            changes[name] = Path(env[ENV[name]])
    if env.get(ENV["token"]):
        changes["token"] = env[ENV["token"]]
    flag = env.get(ENV["insecure"])
    if flag:
        if flag.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise ConfigError(f"{ENV['insecure']}={flag!r}: use true or false")
        changes["insecure"] = flag.lower() in ("1", "true", "yes")
    if not changes:
        return security
    values = {k: getattr(security, k) for k in KEYS} | changes
    return RpcSecurity(**values).check()


def _path(value: Any) -> Path | None:
    return None if value in (None, "") else Path(str(value))


def _read(security: RpcSecurity, name: str) -> bytes | None:
    path = getattr(security, name)
    if path is None:
        return None
    try:
        data: bytes = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{_setting(name)} = {path}: cannot read it ({exc.strerror})"
                          ) from exc
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{_setting(name)} = {path}: not a PEM file")
    return data


# ----------------------------------------------------------------------------- servers


def is_loopback(address: str) -> bool:
    """True when ``host:port`` (or a client's target) names this machine only."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_credentials(security: RpcSecurity) -> grpc.ServerCredentials | None:
    """A server's credentials (None: plaintext). With ``ca`` and no token, clients must
    present a certificate the CA signed."""
    if not security.tls:
        return None
    cert, key, ca = (_read(security, n) for n in ("cert", "key", "ca"))
    if cert is None or key is None:
        raise ConfigError(f"a server needs {_setting('cert')} and {_setting('key')} for TLS "
                          f"(only {_setting('ca')} is set)")
    require = ca is not None and security.token is None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=require)


def add_port(server: Any, listen: str, security: RpcSecurity, role: str) -> int:
    """Bind ``listen`` on ``server`` with ``security``; the real port. ``role`` names the
    server in messages (``scheduler``, ``Submitter``)."""
    credentials = server_credentials(security)
    if credentials is None and not security.insecure and not is_loopback(listen):
        raise ConfigError(
            f"the {role} would listen on {listen} without TLS: anyone who reaches that port "
            f"could submit work. Set {_setting('cert')}, {_setting('key')} and "
            f"{_setting('ca')} (`asynctier dev certs --out DIR` makes some to try), listen "
            f"on 127.0.0.1, or set {_setting('insecure')} = true to accept plaintext")
    try:
        port = (server.add_insecure_port(listen) if credentials is None
                else server.add_secure_port(listen, credentials))
    except RuntimeError as exc:  # grpc's way of saying the address cannot be bound
        raise ServiceError(f"the {role} cannot listen on {listen}: {exc}; is another "
                           "process using it? (use port 0 for any free port)") from exc
    if credentials is None and not is_loopback(listen):
        log.warning("the %s listens on %s WITHOUT TLS ([rpc] insecure = true): anyone who "
                    "reaches the port can submit work. Set [rpc] ca, cert and key for "
                    "mutual TLS.", role, listen)
    return int(port)


Continuation = Callable[[Any], Awaitable[Any]]


class TokenCheck(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call without the shared token (UNAUTHENTICATED) before its handler runs."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Continuation, details: Any) -> Any:
        """The call's handler, or one that refuses it when its token is wrong."""
        handler = await continuation(details)
        if handler is None or self._allowed(details.invocation_metadata or ()):
            return handler
        return _refusal(handler)

    def _allowed(self, metadata: Sequence[Any]) -> bool:
        given = next((m.value for m in metadata if m.key == TOKEN_HEADER), "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        return hmac.compare_digest(given, self._expected)


REFUSED = ("this call carries no valid token: set [rpc] token (env ASYNCTIER_RPC_TOKEN) to "
           "the servers' token")


def _refusal(handler: Any) -> Any:
    """A handler of ``handler``'s kind that aborts with UNAUTHENTICATED."""
    async def abort(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)

    async def abort_stream(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        yield  # pragma: no cover - a generator; abort raises

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    streams = handler.response_streaming
    make = kinds[(bool(handler.request_streaming), bool(streams))]
    return make(abort_stream if streams else abort,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def server_interceptors(security: RpcSecurity) -> list[Any]:
    """The interceptors every platform server is built with (the token check)."""
    return [] if security.token is None else [TokenCheck(security.token)]


# ----------------------------------------------------------------------------- clients


def channel_credentials(security: RpcSecurity) -> grpc.ChannelCredentials | None:
    """A client's credentials (None: plaintext): the CA to trust, this client's
    certificate when set, and the token on every call when set."""
    if not security.tls:
        return None
    ca, cert, key = (_read(security, n) for n in ("ca", "cert", "key"))
    if ca is None:
        raise ConfigError(f"a client needs {_setting('ca')} to check the server's "
                          "certificate")
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                         certificate_chain=cert)
    if security.token is None:
        return creds
    return grpc.composite_channel_credentials(
        creds, grpc.access_token_call_credentials(security.token))


def failure_hint(code: Any, details: str, security: RpcSecurity) -> str:
    """What an operator checks when a call failed with ``code`` (empty: nothing to add).

    A server that refuses a client's certificate closes the connection: the client sees
    UNAVAILABLE as for a server that is down, so with TLS the hint names the certificate."""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (f"; the server refused the token: set {_setting('token')} to the servers' "
                "token")
    if code != grpc.StatusCode.UNAVAILABLE:
        return ""
    if "handshake" in details.lower():
        return (f"; the TLS handshake failed ({details}): does {_setting('ca')} hold the CA "
                "that signed the server's certificate, and is the certificate valid for the "
                "address?")
    if security.tls:
        return (f"; if the server is up, it may refuse this client's certificate: check "
                f"{_setting('cert')} and {_setting('key')} are signed by the server's CA")
    return ""


def open_channel(address: str, security: RpcSecurity,
                 options: Sequence[tuple[str, Any]]) -> grpc.Channel:
    """A channel to ``address`` secured as configured; plaintext to a non-loopback address
    only with ``insecure = true``."""
    credentials = channel_credentials(security)
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=list(options))
    if not security.insecure and not is_loopback(address):
        raise ConfigError(f"refusing plaintext gRPC to {address}: set {_setting('ca')} (and "
                          f"cert/key for mutual TLS), or {_setting('insecure')} = true")
    return grpc.insecure_channel(address, options=list(options))
