"""Security: functions only from allowed modules (at bind time and again at run time), no
client properties from a binding, and Kafka SASL/PLAIN plus Redis AUTH end to end with no
secret in any log line.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from confluent_kafka import Producer

from asynctier import dev as devstack
from asynctier.cli import main
from asynctier.delay_streams.topics import ensure_binding_topics
from asynctier.platform.allowlist import check_function_allowed
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import (
    Breaker,
    Deadlines,
    Execution,
    Limits,
    Payload,
    Retries,
    Source,
)
from asynctier.platform.config import Settings
from asynctier.platform.errors import ModuleNotAllowed
from asynctier.platform.kafka import admin, ensure_topics
from asynctier.platform.registry import BindingRegistry
from asynctier.scheduler.resolver import FunctionResolver
from asynctier.tailers.kafka import TailerOptions, consumer_config
from tests.faults.checker import read_ledger, succeeded
from tests.faults.harness import FaultPlatform
from tests.helpers import wait_until
from tests.platform_harness import read_topic

DANGEROUS = ["os:system", "builtins:eval", "builtins:exec", "subprocess:run",
             "subprocess:Popen", "importlib:import_module", "pickle:loads", "shutil:rmtree",
             "posix:system", "ctypes:CDLL", "runpy:run_path"]


# -- functions only from allowed modules ---------------------------------------------------


@pytest.mark.parametrize("path", DANGEROUS)
def test_dangerous_functions_are_refused_by_both_checks_even_when_allowed(path: str) -> None:
    module = path.partition(":")[0]
    with pytest.raises(ModuleNotAllowed):
        check_function_allowed(path, None)
    with pytest.raises(ModuleNotAllowed):
        check_function_allowed(path, [module])
    with pytest.raises(ModuleNotAllowed):
        FunctionResolver([module, "tests"]).resolve(path)


def _resolver_refusal(path: str, allow_modules: list[str]) -> str:
    with pytest.raises(ModuleNotAllowed) as refused:
        FunctionResolver(allow_modules).resolve(path)
    return str(refused.value)


@pytest.mark.parametrize(("path", "allow"), [
    ("threading:Thread", "threading"), ("os:system", "os"), ("os.path:join", "os"),
    ("concurrent.futures:ThreadPoolExecutor", "concurrent.futures"),
    ("asyncio.subprocess:create_subprocess_exec", "asyncio"),
    ("_thread:start_new_thread", "_thread"), ("tests.funcs.evil:run", "tests.funcs.basic")])
def test_bind_refuses_what_the_scheduler_refuses_with_its_message(path: str,
                                                                   allow: str) -> None:
    # No Kafka is needed: bind refuses before it looks at the topic.
    env = {"ASYNCTIER_KAFKA_BOOTSTRAP": "127.0.0.1:9", "ASYNCTIER_ALLOW_MODULES": allow}
    done = CliRunner().invoke(main, ["bind", "evil", "--topic", "t", "--function", path],
                              env=env)
    message = _resolver_refusal(path, [allow])
    assert done.exit_code == 2, done.output
    assert f"error: function: {message}\n" in done.output, (done.output, message)
    with pytest.raises(ModuleNotAllowed) as refused:
        check_function_allowed(path, [allow])
    assert str(refused.value) == message


@pytest.fixture
def plat(settings: Settings, tmp_path: Path) -> Iterator[FaultPlatform]:
    """The test's processes."""
    platform = FaultPlatform(settings, tmp_path)
    yield platform
    platform.stop_all()


def test_dangerous_functions_refused_at_bind_and_at_run_time(
        plat: FaultPlatform, settings: Settings, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic(1)
    plat.extra_env["ASYNCTIER_ALLOW_MODULES"] = "tests.faults,os,builtins,subprocess"
    for n, path in enumerate(("os:system", "builtins:eval", "subprocess:run")):
        done = plat.cli("bind", f"evil{n}", "--topic", topic, "--function", path, check=False)
        assert done.returncode != 0 and "module not allowed" in done.stderr, done.stderr
    # Written by someone who skipped the CLI: the scheduler refuses them again.
    evil = [Binding(name=f"evil{n}", source=Source("kafka", topic), function=path)
            for n, path in enumerate(("os:system", "builtins:eval", "subprocess:run"))]
    ensure_binding_topics(settings, evil)
    for binding in evil:
        BindingRegistry(settings).put(binding)
    marker = plat.folder / "pwned"
    _produce(settings, topic, [(None, json.dumps(f"touch {marker}").encode())])
    plat.start("scheduler")
    plat.start("tailers")
    for binding in evil:
        dlq = settings.names.dlq_topic(binding.name)
        letters: list[Any] = wait_until(lambda t=dlq: read_topic(settings, t), 60,  # type: ignore[misc]
                                        f"{binding.function} dead-lettered")
        error = dict(letters[0].headers())["asynctier.error"]
        assert b"module not allowed" in error, error
    assert not marker.exists()
    assert "is ignored: it is on the deny list" in plat.log_text("scheduler")


# -- no client properties from a binding ---------------------------------------------------


def test_a_binding_has_no_field_for_client_properties() -> None:
    fields = {f.name for f in dataclasses.fields(Binding)} | {
        f.name for g in (Source, Payload, Limits, Retries, Breaker, Execution, Deadlines)
        for f in dataclasses.fields(g)}
    schema = json.loads(Path("schemas/binding.avsc").read_text())
    names = {f["name"] for f in schema["fields"]}
    for word in ("kafka", "config", "properties", "sasl", "ssl", "plugin", "librdkafka"):
        assert not any(word in name for name in fields | names), word


def test_client_properties_come_only_from_the_operators_config() -> None:
    operator = {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    settings = Settings(kafka=operator)
    conf = consumer_config(settings, "g", TailerOptions())
    fixed = {"group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
             "partition.assignment.strategy", "session.timeout.ms", "max.poll.interval.ms",
             "fetch.wait.max.ms", "queued.max.messages.kbytes", "fetch.max.bytes",
             "fetch.queue.backoff.ms"}
    assert set(conf) == set(operator) | fixed
    assert not any(k.startswith(("plugin.", "ssl.engine")) for k in conf)


def test_bind_has_no_option_for_client_properties(plat: FaultPlatform) -> None:
    text = plat.cli("bind", "--help").stdout
    for word in ("--property", "--config-", "sasl", "ssl", "plugin", "-X"):
        assert word not in text, word


# -- SASL/PLAIN and Redis AUTH, no secret in the logs --------------------------------------


@pytest.fixture
def secure_stack(tmp_path: Path) -> Iterator[tuple[devstack.KafkaNode, devstack.RedisNode]]:
    """A Kafka with a SASL/PLAIN listener and a Redis with requirepass, of this test only."""
    users = {"admin": "adm-" + uuid.uuid4().hex, "asynctier": "kafka-" + uuid.uuid4().hex}
    kafka = devstack.start_test_kafka(tmp_path / "secure", sasl_plain_users=users)
    try:
        red = devstack.start_test_redis(tmp_path / "secure",
                                        password="redis-" + uuid.uuid4().hex)
    except BaseException:
        kafka.stop()
        raise
    yield kafka, red
    red.stop()
    kafka.stop()


def test_sasl_plain_and_redis_auth_end_to_end_no_secret_logged(
        secure_stack: tuple[devstack.KafkaNode, devstack.RedisNode], tmp_path: Path,
        prefix: str) -> None:
    kafka, red = secure_stack
    client = kafka.client_config("asynctier")
    secrets = [client["sasl.password"], red.password or "",
               *(kafka.sasl_plain_users or {}).values()]
    assert not devstack.kafka_answers(kafka.bootstrap, timeout_s=3.0)  # no credentials
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=red.port).ping()
    config = tmp_path / "asynctier.toml"
    config.write_text(f'[asynctier]\nprefix = "{prefix}"\n\n[kafka]\n'
                      + "".join(f'"{k}" = "{v}"\n' for k, v in client.items())
                      + f'\n[redis]\nurl = "{red.url}"\n')
    config.chmod(0o600)
    settings = Settings.load(config, env={})
    topic = f"{prefix}.orders"
    ensure_topics(admin(settings), {topic: (2, {})})
    plat = FaultPlatform(settings, tmp_path, env={"ASYNCTIER_CONFIG": str(config)})
    try:
        docs = [{"id": i, **({"fail_until": 2} if i % 10 == 0 else {})} for i in range(200)]
        _produce(settings, topic, [(None, json.dumps(d).encode()) for d in docs])
        plat.bind("orders", topic, "--retry-ladder", "1s,2s")
        plat.start("scheduler")
        plat.start("delay")
        plat.start("tailers")
        wait_until(lambda: set(succeeded(read_ledger(plat.ledger))) >= set(range(200)), 90,
                   "every record ran through SASL Kafka and password Redis")
        members = redis.Redis.from_url(red.url).keys(f"{prefix}:*")
        assert members, "the scheduler registered itself in the password-protected Redis"
        outputs = [plat.cli("bindings").stdout, plat.cli("lag").stdout]
    finally:
        plat.stop_all()
    logs = {p.name: p.read_text(errors="replace") for p in tmp_path.glob("*.log")}
    assert logs and all(logs.values())
    for secret in secrets:
        assert secret
        for name, text in [*logs.items(), *(("cli", o) for o in outputs)]:
            assert secret not in text, f"a secret is in {name}"


def _produce(settings: Settings, topic: str,
             records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer(settings.kafka_config())
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(60) == 0
