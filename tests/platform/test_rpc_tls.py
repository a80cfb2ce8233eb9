"""TLS, mutual TLS and a shared token on the scheduler's gRPC: a client the CA did not
sign, or without the token, is refused and no item of its call runs; ``[rpc]`` settings
and their errors name what to fix; plaintext off loopback only when the operator says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from asynctier.cli import main
from asynctier.dev.certs import CertFiles, write_certs
from asynctier.platform import rpc, wire
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.binding_source import StaticBindings
from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError, SchedulerUnavailable
from asynctier.platform.rpcsecurity import RpcSecurity, open_channel
from asynctier.platform.wire import encode_items
from asynctier.scheduler import run_scheduler
from tests.funcs import basic
from tests.scheduler_harness import items, running_scheduler

RECORD = Binding("rec", Source("kafka", "rec"), "tests.funcs.basic:record")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A CA with a server and a client certificate."""
    return write_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """Certificates of another CA."""
    return write_certs(tmp_path_factory.mktemp("other"), name="someone else")


def server_side(certs: CertFiles, token: str | None = None) -> RpcSecurity:
    """The scheduler's [rpc]."""
    return RpcSecurity(ca=certs.ca, cert=certs.server, key=certs.server_key, token=token)


def client_side(certs: CertFiles, ca: Path | None = None, token: str | None = None,
                with_cert: bool = True) -> RpcSecurity:
    """A tailer's [rpc]."""
    return RpcSecurity(ca=ca or certs.ca, cert=certs.client if with_cert else None,
                       key=certs.client_key if with_cert else None, token=token)


def call(address: str, security: RpcSecurity, count: int = 5) -> grpc.RpcError | bytes:
    """One raw submit call of ``count`` items: its reply, or the error it failed with."""
    with open_channel(address, security, rpc.CHANNEL_OPTIONS) as channel:
        submit = channel.unary_unary(rpc.SUBMIT, request_serializer=None,
                                     response_deserializer=None)
        try:
            reply: bytes = submit(encode_items(items("rec", count)), timeout=10)
            return reply
        except grpc.RpcError as exc:
            return exc


@pytest.fixture
def mtls(settings: Settings, certs: CertFiles) -> Iterator[str]:
    """A scheduler that takes mutual TLS only; its address."""
    basic.reset()
    with running_scheduler(replace(settings, rpc=server_side(certs)), [RECORD]) as sched:
        yield sched.address


def test_a_client_with_a_certificate_of_the_ca_runs_its_batch(mtls: str,
                                                              certs: CertFiles) -> None:
    reply = call(mtls, client_side(certs), count=5)
    assert isinstance(reply, bytes), reply
    outcomes = wire.decode_outcomes(reply)
    assert sorted(o["id"] for o in outcomes) == list(range(5))
    assert len(basic.SEEN) == 5


@pytest.mark.parametrize("who", ["no certificate", "another CA", "plaintext"])
def test_a_client_the_ca_did_not_sign_is_refused_and_nothing_runs(
        mtls: str, certs: CertFiles, other_ca: CertFiles, who: str) -> None:
    security = {"no certificate": client_side(certs, with_cert=False),
                "another CA": client_side(other_ca, ca=certs.ca),
                "plaintext": RpcSecurity()}[who]
    refused = call(mtls, security)
    assert isinstance(refused, grpc.RpcError), "the scheduler took the call"
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert basic.SEEN == [], "an item of a refused call ran"


def test_a_client_that_does_not_trust_the_server_ca_does_not_send(
        mtls: str, certs: CertFiles, other_ca: CertFiles) -> None:
    refused = call(mtls, client_side(certs, ca=other_ca.ca))
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert basic.SEEN == []


def test_the_token_mode_refuses_a_call_without_the_token(settings: Settings,
                                                         certs: CertFiles) -> None:
    basic.reset()
    token = "tok-" + "s3cret" * 4
    server = replace(settings, rpc=server_side(certs, token=token))
    with running_scheduler(server, [RECORD]) as sched:
        for wrong in (None, token + "x"):
            refused = call(sched.address, client_side(certs, token=wrong, with_cert=False)
                           if wrong else client_side(certs, with_cert=False))
            assert isinstance(refused, grpc.RpcError)
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused
            assert "[rpc] token" in (refused.details() or "")
            assert token not in (refused.details() or "")
        assert basic.SEEN == []
        reply = call(sched.address, client_side(certs, token=token, with_cert=False))
        assert isinstance(reply, bytes), reply
        assert len(basic.SEEN) == 5


def test_the_platform_client_runs_batches_over_mtls(settings: Settings,
                                                     certs: CertFiles) -> None:
    basic.reset()
    with running_scheduler(replace(settings, rpc=server_side(certs)), [RECORD]) as sched:
        client = rpc.SchedulerClient(lambda: [sched.address], security=client_side(certs))
        try:
            outcomes = client.submit(items("rec", 50)).result()
        finally:
            client.close()
    assert len(outcomes) == 50 and len(basic.SEEN) == 50


def test_a_tailer_refused_keeps_its_batch_and_says_which_setting_to_check(
        mtls: str, certs: CertFiles, other_ca: CertFiles,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    stopping = threading.Event()
    stopping.set()  # give up after the first refusal instead of waiting for a scheduler
    for security, hint in [(client_side(other_ca, ca=certs.ca), "[rpc] cert"),
                           (client_side(certs, ca=other_ca.ca), "TLS handshake failed")]:
        client = rpc.SchedulerClient(lambda: [mtls], security=security)
        try:
            with pytest.raises(SchedulerUnavailable):
                client.submit(items("rec", 3)).result(stopping)
        finally:
            client.close()
        assert any(hint in r.getMessage() for r in caplog.records), hint
    assert basic.SEEN == []


# -- settings ---------------------------------------------------------------------------


def test_rpc_settings_from_the_file_and_the_environment(tmp_path: Path,
                                                        certs: CertFiles) -> None:
    config = tmp_path / "asynctier.toml"
    config.write_text(f'[rpc]\nca = "{certs.ca}"\ncert = "{certs.server}"\n'
                      f'key = "{certs.server_key}"\n')
    loaded = Settings.load(config, env={})
    assert loaded.rpc == server_side(certs)
    assert loaded.rpc.describe() == "mutual TLS"
    env = {"ASYNCTIER_RPC_CERT": str(certs.client), "ASYNCTIER_RPC_KEY": str(certs.client_key),
           "ASYNCTIER_RPC_TOKEN": "t0ken"}
    over = Settings.load(config, env=env).rpc
    assert (over.cert, over.key, over.token) == (certs.client, certs.client_key, "t0ken")
    assert "t0ken" not in repr(over)
    insecure = Settings.load(None, env={"ASYNCTIER_RPC_INSECURE": "true"}).rpc
    assert insecure.insecure and not insecure.tls


@pytest.mark.parametrize(("table", "names"), [
    ('cert = "a.pem"', "[rpc] key (env ASYNCTIER_RPC_KEY)"),
    ('token = "t"', "[rpc] token (env ASYNCTIER_RPC_TOKEN)"),
    ('insecure = true\nca = "ca.pem"', "[rpc] insecure"),
    ('insecure = "yes"', "[rpc] insecure"),
    ('certificate = "a.pem"', "unknown key(s) ['certificate'] in [rpc]"),
])
def test_a_wrong_rpc_table_names_the_setting(tmp_path: Path, table: str, names: str) -> None:
    config = tmp_path / "asynctier.toml"
    config.write_text(f"[rpc]\n{table}\n")
    with pytest.raises(ConfigError) as bad:
        Settings.load(config, env={})
    assert names in str(bad.value)


def test_a_missing_certificate_file_names_the_setting(settings: Settings, tmp_path: Path,
                                                      certs: CertFiles) -> None:
    gone = replace(server_side(certs), key=tmp_path / "nowhere-key.pem")
    thread, _, errors = _start(replace(settings, rpc=gone), "127.0.0.1:0")
    thread.join(30)
    assert errors and isinstance(errors[0], ConfigError), errors
    assert "[rpc] key (env ASYNCTIER_RPC_KEY)" in str(errors[0])
    assert "nowhere-key.pem" in str(errors[0])


def _start(settings: Settings, listen: str) -> tuple[threading.Thread, threading.Event,
                                                     list[BaseException]]:
    stop, errors, ready = threading.Event(), [], threading.Event()

    def run() -> None:
        try:
            run_scheduler(settings, listen=listen, allow_modules=("tests.funcs",), stop=stop,
                          bindings=StaticBindings([RECORD]),
                          ready_callback=lambda _: ready.set())
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60), "the scheduler neither started nor failed"
    return thread, stop, errors


def test_plaintext_off_loopback_only_when_the_operator_says_so(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    thread, stop, errors = _start(settings, "0.0.0.0:0")
    thread.join(30)
    assert errors and isinstance(errors[0], ConfigError), errors
    assert "[rpc] insecure" in str(errors[0]) and "0.0.0.0" in str(errors[0])
    caplog.set_level(logging.WARNING)
    thread, stop, errors = _start(replace(settings, rpc=RpcSecurity(insecure=True)),
                                  "0.0.0.0:0")
    stop.set()
    thread.join(60)
    assert not errors, errors
    assert any("WITHOUT TLS" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match=r"refusing plaintext gRPC to 10\.1\.2\.3:50051"):
        open_channel("10.1.2.3:50051", RpcSecurity(), [])


def test_dev_certs_writes_the_five_files(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    done = CliRunner().invoke(main, ["dev", "certs", "--out", str(out), "--host", "sched.lan"])
    assert done.exit_code == 0, done.output
    names = {"ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"}
    assert {p.name for p in out.iterdir()} == names
    assert (out / "server-key.pem").stat().st_mode & 0o077 == 0
    assert "[rpc]" in done.output
