"""TLS everywhere, end to end on the real servers with certificates the test makes: Kafka
over SASL_SSL and over SSL with client certificates, Redis over TLS with an ACL user, and the
tailer -> scheduler link over mutual TLS. Wrong credentials: a message naming the setting
to fix, no secret in any log line, and nothing lost once they are fixed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from asynctier import dev as devstack
from asynctier.dev.certs import CertFiles, write_certs
from asynctier.dev.process import TlsFiles
from asynctier.platform.config import Settings
from asynctier.platform.kafka import admin, ensure_topics
from tests.faults.checker import read_ledger, succeeded
from tests.faults.harness import FaultPlatform, make_docs, produce
from tests.helpers import wait_until


def _tls(certs: CertFiles) -> TlsFiles:
    return TlsFiles(certs.ca, certs.server, certs.server_key)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A CA with a server and a client certificate."""
    return write_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory,
              certs: CertFiles) -> Iterator[devstack.RedisNode]:
    """A Redis on TLS only, with one ACL user (the default user off), of this module."""
    red = devstack.start_test_redis(tmp_path_factory.mktemp("redis"), tls=_tls(certs),
                                    acl_users={"asynctier": "redis-" + uuid.uuid4().hex})
    yield red
    red.stop()


@pytest.fixture
def ssl_kafka(tmp_path: Path, certs: CertFiles) -> Iterator[devstack.KafkaNode]:
    """A Kafka on SSL requiring a client certificate its CA signed, of this test."""
    kafka = devstack.start_test_kafka(tmp_path, tls=_tls(certs))
    yield kafka
    kafka.stop()


@pytest.fixture
def sasl_ssl_kafka(tmp_path: Path, certs: CertFiles) -> Iterator[devstack.KafkaNode]:
    """A Kafka on SASL_SSL (PLAIN over TLS) of this test."""
    users = {"admin": "adm-" + uuid.uuid4().hex, "asynctier": "kafka-" + uuid.uuid4().hex}
    kafka = devstack.start_test_kafka(tmp_path, sasl_plain_users=users, tls=_tls(certs))
    yield kafka
    kafka.stop()


def secrets_of(*nodes: devstack.KafkaNode | devstack.RedisNode) -> list[str]:
    """Every password of these servers."""
    found: list[str] = []
    for node in nodes:
        users = (node.sasl_plain_users if isinstance(node, devstack.KafkaNode)
                 else node.acl_users)
        found += list((users or {}).values())
    return found


def write_config(path: Path, prefix: str, kafka: dict[str, str], redis_url: str) -> Path:
    """An asynctier.toml (mode 0600) with these Kafka properties and Redis URL."""
    path.write_text(f'[asynctier]\nprefix = "{prefix}"\n\n[kafka]\n'
                    + "".join(f'"{k}" = "{v}"\n' for k, v in kafka.items())
                    + '"session.timeout.ms" = "6000"\n"heartbeat.interval.ms" = "1000"\n'
                    + f'\n[redis]\nurl = "{redis_url}"\n')
    path.chmod(0o600)
    return path


def mtls_env(certs: CertFiles) -> dict[str, str]:
    """The platform's processes on mutual TLS (one certificate for server and client)."""
    return {"ASYNCTIER_RPC_CA": str(certs.ca), "ASYNCTIER_RPC_CERT": str(certs.server),
            "ASYNCTIER_RPC_KEY": str(certs.server_key)}


def platform(settings: Settings, folder: Path, config: Path,
             certs: CertFiles) -> FaultPlatform:
    """The test's processes, reading ``config``, on mutual TLS."""
    return FaultPlatform(settings, folder, env={"ASYNCTIER_CONFIG": str(config),
                                                **mtls_env(certs)})


def assert_no_secret(folder: Path, secrets: list[str], *outputs: str) -> None:
    """No password in any process log nor in ``outputs``."""
    logs = {p.name: p.read_text(errors="replace") for p in folder.glob("*.log")}
    assert logs and all(logs.values())
    for secret in secrets:
        assert secret
        for name, text in [*logs.items(), *(("cli", o) for o in outputs)]:
            assert secret not in text, f"a secret is in {name}"


def run_records(plat: FaultPlatform, settings: Settings, count: int,
                timeout_s: float, failing_every: int = 0) -> None:
    """Bind, produce ``count`` records (every ``failing_every``-th fails once), run the
    platform, wait until each succeeded."""
    topic = f"{settings.prefix}.orders"
    ensure_topics(admin(settings), {topic: (2, {})})
    produce(settings, topic, make_docs(count, failing_every=failing_every))
    plat.bind("orders", topic, "--retry-ladder", "1s,2s")
    plat.start("scheduler")
    plat.start("delay")
    plat.start("tailers")
    wait_until(lambda: set(succeeded(read_ledger(plat.ledger))) >= set(range(count)),
               timeout_s, f"all {count} records ran over SASL_SSL, Redis TLS and mTLS")


def test_redis_tls_acl_and_mtls_end_to_end_no_secret_logged(
        tls_redis: devstack.RedisNode, certs: CertFiles, kafka_bootstrap: str,
        tmp_path: Path, prefix: str) -> None:
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=tls_redis.port, socket_timeout=2).ping()  # plaintext
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(tls_redis.url_of(None, "guess")).ping()  # the default user
    config = write_config(tmp_path / "asynctier.toml", prefix,
                          {"bootstrap.servers": kafka_bootstrap}, tls_redis.url)
    settings = Settings.load(config, env={})
    plat = platform(settings, tmp_path, config, certs)
    try:
        run_records(plat, settings, 50, 120)
        assert redis.Redis.from_url(tls_redis.url).keys(f"{prefix}:*")
        outputs = [plat.cli("bindings").stdout, plat.cli("lag").stdout]
    finally:
        plat.stop_all()
    assert "mutual TLS" in plat.log_text("scheduler")
    assert_no_secret(tmp_path, secrets_of(tls_redis), *outputs)


def test_a_wrong_redis_password_names_the_setting(tls_redis: devstack.RedisNode,
                                                  certs: CertFiles, kafka_bootstrap: str,
                                                  tmp_path: Path, prefix: str) -> None:
    wrong = write_config(tmp_path / "wrong.toml", prefix, {"bootstrap.servers": kafka_bootstrap},
                         tls_redis.url_of("asynctier", "not-it-5678"))
    plat = platform(Settings.load(wrong, env={}), tmp_path, wrong, certs)
    try:
        plat.start("scheduler")
        wait_until(lambda: "Redis refused the credentials" in plat.log_text("scheduler"), 60,
                   "the scheduler names [redis] url")
    finally:
        plat.stop_all()
    text = plat.log_text("scheduler")
    assert "[redis] url (env ASYNCTIER_REDIS_URL)" in text
    for secret in ("not-it-5678", *secrets_of(tls_redis)):
        assert secret not in text


def test_kafka_sasl_ssl_end_to_end_and_a_wrong_password_loses_nothing(
        sasl_ssl_kafka: devstack.KafkaNode, tls_redis: devstack.RedisNode, certs: CertFiles,
        tmp_path: Path, prefix: str) -> None:
    kafka = sasl_ssl_kafka
    assert not devstack.kafka_answers(kafka.bootstrap, timeout_s=3.0)  # no TLS, no SASL
    right = write_config(tmp_path / "right.toml", prefix, kafka.client_config("asynctier"),
                         tls_redis.url)
    settings = Settings.load(right, env={})
    wrong_kafka = {**kafka.client_config("asynctier"), "sasl.password": "not-it-1234"}
    wrong = write_config(tmp_path / "wrong.toml", prefix, wrong_kafka, tls_redis.url)
    bad = platform(Settings.load(wrong, env={}), tmp_path / "bad", wrong, certs)
    (tmp_path / "bad").mkdir()
    good = platform(settings, tmp_path, right, certs)
    try:
        topic = f"{prefix}.orders"
        ensure_topics(admin(settings), {topic: (2, {})})
        produce(settings, topic, make_docs(200, failing_every=50))
        good.bind("orders", topic, "--retry-ladder", "1s,2s")
        good.start("scheduler")
        bad.extra_env["ASYNCTIER_SCHEDULERS"] = f"127.0.0.1:{good.ports['scheduler']}"
        bad.start("tailers")
        wait_until(lambda: "sasl.password" in bad.log_text("tailers"), 90,
                   "the tailers with the wrong password name [kafka] sasl.password")
        assert not read_ledger(good.ledger), "a record ran with the wrong credentials"
        bad.stop_all()
        good.start("delay")
        good.start("tailers")
        wait_until(lambda: set(succeeded(read_ledger(good.ledger))) >= set(range(200)), 120,
                   "every record ran over SASL_SSL once the password was fixed")
        outputs = [good.cli("bindings").stdout, good.cli("lag").stdout]
    finally:
        bad.stop_all()
        good.stop_all()
    assert "mutual TLS" in good.log_text("scheduler")
    for folder in (tmp_path, tmp_path / "bad"):
        assert_no_secret(folder, [*secrets_of(kafka, tls_redis), "not-it-1234"], *outputs)


def client_cert_config(kafka: devstack.KafkaNode, cert: Path | None,
                       key: Path | None) -> dict[str, str]:
    """The SSL properties of ``kafka`` with this client certificate (None: none at all)."""
    conf = {k: v for k, v in kafka.client_config().items()
            if k not in ("ssl.certificate.location", "ssl.key.location")}
    if cert is not None and key is not None:
        conf.update({"ssl.certificate.location": str(cert), "ssl.key.location": str(key)})
    return conf


def key_lines(*keys: Path) -> list[str]:
    """The secret lines (base64 body) of these PEM private keys."""
    return [line for key in keys for line in key.read_text().splitlines()
            if line and not line.startswith("-----")]


@pytest.mark.timeout(900)  # a broker on TLS, then three platforms' processes
def test_kafka_ssl_client_certificates_end_to_end_and_a_wrong_one_loses_nothing(
        ssl_kafka: devstack.KafkaNode, tls_redis: devstack.RedisNode, certs: CertFiles,
        tmp_path: Path, prefix: str) -> None:
    kafka = ssl_kafka
    other = write_certs(tmp_path / "other-ca", name="another")  # a CA the broker does not know
    assert not devstack.kafka_answers(kafka.bootstrap, timeout_s=3.0)  # no TLS
    assert not devstack.kafka_answers(kafka.bootstrap, timeout_s=5.0,  # TLS, no certificate
                                      config=client_cert_config(kafka, None, None))
    right = write_config(tmp_path / "right.toml", prefix,
                         client_cert_config(kafka, certs.client, certs.client_key),
                         tls_redis.url)
    settings = Settings.load(right, env={})
    good = platform(settings, tmp_path, right, certs)
    bads: dict[str, FaultPlatform] = {}
    for name, conf in {"wrong": client_cert_config(kafka, other.client, other.client_key),
                       "missing": client_cert_config(kafka, None, None)}.items():
        config = write_config(tmp_path / f"{name}.toml", prefix, conf, tls_redis.url)
        (tmp_path / name).mkdir()
        bads[name] = platform(Settings.load(config, env={}), tmp_path / name, config, certs)
    dead = {200, 201, 202}
    try:
        topic = f"{prefix}.orders"
        ensure_topics(admin(settings), {topic: (2, {})})
        produce(settings, topic, make_docs(203, failing_every=50,
                                           extra={i: {"always_fail": True} for i in dead}))
        good.bind("orders", topic, "--retry-ladder", "1s,2s")
        good.start("scheduler")
        for bad in bads.values():
            bad.extra_env["ASYNCTIER_SCHEDULERS"] = f"127.0.0.1:{good.ports['scheduler']}"
            bad.start("tailers")
        for name, bad in bads.items():
            wait_until(lambda bad=bad: "ssl.certificate.location" in bad.log_text("tailers"),
                       120, f"the tailers with a {name} client certificate name "
                       "[kafka] ssl.certificate.location")
            assert "refused this client's certificate" in bad.log_text("tailers")
        assert not read_ledger(good.ledger), "a record ran with a refused certificate"
        for bad in bads.values():
            bad.stop_all()
        good.start("delay")
        good.start("tailers")
        wait_until(lambda: set(succeeded(read_ledger(good.ledger))) >= set(range(200))
                   and set(good.dead_letters("orders")) >= dead, 180,
                   "every record ran (or was dead-lettered) over SSL with client certificates")
        outputs = [good.cli("bindings").stdout, good.cli("lag").stdout]
    finally:
        for bad in bads.values():
            bad.stop_all()
        good.stop_all()
    assert set(good.dead_letters("orders")) == dead  # exactly the records that always fail
    assert "mutual TLS" in good.log_text("scheduler")
    secrets = [*key_lines(certs.client_key, certs.server_key, other.client_key),
               *secrets_of(tls_redis)]
    for folder in (tmp_path, *(tmp_path / name for name in bads)):
        assert_no_secret(folder, secrets, *outputs)


@pytest.mark.slow
def test_20000_records_end_to_end_over_mtls(certs: CertFiles, kafka_bootstrap: str,
                                             redis_url: str, tmp_path: Path,
                                             prefix: str) -> None:
    config = write_config(tmp_path / "asynctier.toml", prefix,
                          {"bootstrap.servers": kafka_bootstrap}, redis_url)
    settings = Settings.load(config, env={})
    plat = platform(settings, tmp_path, config, certs)
    try:
        run_records(plat, settings, 20_000, 600)
    finally:
        plat.stop_all()
    assert "mutual TLS" in plat.log_text("scheduler")
