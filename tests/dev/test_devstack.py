"""The local stack against the real thing: Apache Kafka in KRaft mode, redis-server and
PostgreSQL.

These tests start their own stacks on free ports in their own folders, so they never touch
the session's Kafka and Redis (or a developer's `asynctier dev up`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from asynctier import dev as devstack
from asynctier.cli import main
from asynctier.dev.stack import KAFKA_BIN
from asynctier.platform.config import Settings
from asynctier.platform.errors import ServiceError
from asynctier.queue import NewItem, QueueStore
from tests.helpers import wait_until


@pytest.fixture
def ports() -> dict[str, int]:
    return {"kafka": devstack.free_port(), "controller": devstack.free_port(),
            "redis": devstack.free_port(), "postgres": devstack.free_port(),
            "registry": devstack.free_port()}


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """The stack's data folder: in tmp_path, unless PostgreSQL's user cannot reach it
    there (as root: pytest's folders are 0700), then a folder of its own, removed after."""
    root = devstack.postgres_data_root(tmp_path)
    yield root / "data"
    if root != tmp_path:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dev(data_dir: Path, ports: dict[str, int]) -> Iterator[Callable[..., Result]]:
    """Runs ``asynctier dev ...`` in-process against a stack in data_dir; stops it after."""
    runner = CliRunner()
    data = data_dir

    def run(*args: str, input: str | None = None) -> Result:
        argv = ["dev", *args, "--data-dir", str(data), "--kafka-port", str(ports["kafka"]),
                "--controller-port", str(ports["controller"]),
                "--redis-port", str(ports["redis"]), "--postgres-port", str(ports["postgres"]),
                "--registry-port", str(ports["registry"])]
        return runner.invoke(main, argv, input=input)

    yield run
    devstack.DevStack(data, ports["kafka"], ports["controller"], ports["redis"],
                      postgres_port=ports["postgres"]).down(10)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port held by a listening socket that is not ours."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield int(sock.getsockname()[1])
    sock.close()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []

    def read() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
        return len(got) >= count

    try:
        wait_until(read, 60, f"{count} records from {topic}")
    finally:
        consumer.close()
    return got


def test_up_round_trip_down_up_keeps_topics_and_records(
        dev: Callable[..., Result], data_dir: Path, ports: dict[str, int]) -> None:
    first = dev("up")
    assert first.exit_code == 0, first.output
    assert f"kafka  127.0.0.1:{ports['kafka']}" in first.output
    assert "started" in first.output

    status = dev("status")
    assert status.exit_code == 0, status.output
    check = dev("check")
    assert check.exit_code == 0, check.output
    assert "produced and consumed a record" in check.output
    assert "SELECT 1 answered" in check.output
    assert f"ASYNCTIER_QUEUE_SHARDS=postgresql://asynctier@127.0.0.1:{ports['postgres']}/" \
        in first.output

    again = dev("up")
    assert again.exit_code == 0, again.output
    assert again.output.count("already up") == 4
    assert "its subjects listed" in check.output

    stack = devstack.DevStack(data_dir, ports["kafka"], ports["controller"],
                              ports["redis"], postgres_port=ports["postgres"])
    pid = stack.kafka.daemon.pid()
    assert pid is not None
    assert "kafka.Kafka" in devstack.process_cmdline(pid)

    bootstrap = f"127.0.0.1:{ports['kafka']}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("kept", 2, 1)])["kept"].result(30)
    values = [f"record-{i}".encode() for i in range(10)]
    produce(bootstrap, "kept", values)
    assert sorted(consume_all(bootstrap, "kept", 10)) == sorted(values)
    redis.Redis.from_url(stack.redis.url).set("kept", "yes")
    with QueueStore(stack.postgres.dsn) as store:
        store.enqueue("default", [NewItem("kept", b"yes", id="kept")])

    down = dev("down")
    assert down.exit_code == 0, down.output
    assert dev("status").exit_code == 1
    assert stack.kafka.daemon.pid() is None

    assert dev("up").exit_code == 0
    assert sorted(consume_all(bootstrap, "kept", 10)) == sorted(values)
    assert redis.Redis.from_url(stack.redis.url).get("kept") == b"yes"
    with QueueStore(stack.postgres.dsn) as store:
        kept = store.get("default", "kept", "kept")
        assert kept is not None and kept.payload == b"yes"
    assert (data_dir / "postgres" / "pgdata" / "PG_VERSION").is_file()


def test_ports_of_the_last_up_are_remembered(tmp_path: Path, ports: dict[str, int]) -> None:
    stack = devstack.DevStack(tmp_path, ports["kafka"], ports["controller"], ports["redis"],
                              postgres_port=ports["postgres"])
    stack._save_state()
    again = devstack.DevStack.resolve(tmp_path)
    assert (again.kafka_port, again.controller_port, again.redis_port,
            again.postgres_port) == (ports["kafka"], ports["controller"], ports["redis"],
                                     ports["postgres"])
    assert not again.postgres_port_auto


def test_a_taken_postgres_port_becomes_a_free_one_unless_chosen(
        tmp_path: Path, listening: int) -> None:
    fresh = devstack.DevStack.resolve(tmp_path)
    assert (fresh.postgres_port, fresh.postgres_port_auto) == (5432, True)
    assert not devstack.DevStack.resolve(tmp_path, postgres_port=listening).postgres_port_auto
    node = devstack.PostgresNode(tmp_path / "pg", port=listening)
    with pytest.raises(ServiceError, match=f"port {listening} "):
        node.start()


def test_env_prints_export_lines(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dev", "env", "--data-dir", str(tmp_path),
                                       "--kafka-port", "19999", "--redis-port", "16999"])
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        "export ASYNCTIER_KAFKA_BOOTSTRAP=127.0.0.1:19999",
        "export ASYNCTIER_REDIS_URL=redis://127.0.0.1:16999/0",
        "export ASYNCTIER_QUEUE_SHARDS=postgresql://asynctier@127.0.0.1:5432/asynctier",
        "export ASYNCTIER_SCHEMA_REGISTRY=http://127.0.0.1:8081/apis/ccompat/v7",
        f'export PATH="{KAFKA_BIN}:$PATH"',
        "export ASYNCTIER_CONSOLE_LISTEN=127.0.0.1:8089",
    ]
    chosen = CliRunner().invoke(main, ["dev", "env", "--data-dir", str(tmp_path),
                                       "--postgres-port", "15999"])
    assert "ASYNCTIER_QUEUE_SHARDS=postgresql://asynctier@127.0.0.1:15999/asynctier" \
        in chosen.output


def test_env_defaults(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dev", "env", "--data-dir", str(tmp_path)])
    assert "ASYNCTIER_KAFKA_BOOTSTRAP=127.0.0.1:9092" in result.output
    assert "ASYNCTIER_REDIS_URL=redis://127.0.0.1:6379/0" in result.output


def test_missing_binaries_name_the_install_command(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    stack = devstack.DevStack(tmp_path / "data", cache_dir=tmp_path / "cache", path=str(empty))
    with pytest.raises(ServiceError) as caught:
        stack.up()
    message = str(caught.value)
    assert "apt-get install -y openjdk-17-jre-headless" in message
    assert "apt-get install -y redis-server" in message
    assert "apt-get install -y maven" in message
    assert "apt-get install -y postgresql" in message
    assert not (tmp_path / "data" / "kafka").exists()


def test_missing_java_from_the_command_line(tmp_path: Path) -> None:
    """`asynctier dev up` with a PATH that has no java: exit 2 and the install command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    redis_server = devstack.require_binary("redis-server")
    (bin_dir / "redis-server").symlink_to(redis_server)
    env = {**os.environ, "PATH": str(bin_dir)}
    env.pop("ASYNCTIER_DATA_DIR", None)
    cli = Path(sys.executable).with_name("asynctier")
    done = subprocess.run([str(cli), "dev", "up", "--data-dir", str(tmp_path / "data")],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "apt-get install -y openjdk-17-jre-headless" in done.stderr
    assert "redis-server:" not in done.stderr


def test_require_binary_for_mvn(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="apt-get install -y maven"):
        devstack.require_binary("mvn", path=str(tmp_path))


def test_taken_kafka_port_is_named(tmp_path: Path, listening: int) -> None:
    stack = devstack.DevStack(tmp_path, kafka_port=listening,
                              controller_port=devstack.free_port(),
                              redis_port=devstack.free_port())
    with pytest.raises(ServiceError, match=f"port {listening} "):
        stack.up()


def test_taken_controller_port_is_named(tmp_path: Path, listening: int) -> None:
    node = devstack.KafkaNode(tmp_path, port=devstack.free_port(), controller_port=listening)
    with pytest.raises(ServiceError, match=f"port {listening} .*controller"):
        node.start()


def test_taken_redis_port_is_named(tmp_path: Path, listening: int) -> None:
    node = devstack.RedisNode(tmp_path, port=listening)
    with pytest.raises(ServiceError, match=f"port {listening} "):
        node.start()


def test_taken_port_from_the_command_line(tmp_path: Path, listening: int) -> None:
    result = CliRunner().invoke(main, ["dev", "up", "--data-dir", str(tmp_path),
                                       "--kafka-port", str(listening),
                                       "--controller-port", str(devstack.free_port())])
    assert result.exit_code == 2
    assert f"port {listening}" in result.output


def test_reset_asks_unless_yes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "kafka").mkdir(parents=True)
    runner = CliRunner()
    no = runner.invoke(main, ["dev", "reset", "--data-dir", str(data)], input="n\n")
    assert no.exit_code == 1
    assert data.exists()
    yes = runner.invoke(main, ["dev", "reset", "--yes", "--data-dir", str(data)])
    assert yes.exit_code == 0, yes.output
    assert not data.exists()


def test_status_of_a_stack_that_is_down(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dev", "status", "--data-dir", str(tmp_path),
                                       "--kafka-port", str(devstack.free_port()),
                                       "--redis-port", str(devstack.free_port()),
                                       "--postgres-port", str(devstack.free_port())])
    assert result.exit_code == 1
    assert result.output.count("down") == 4


def test_a_pid_file_of_another_program_is_ignored(tmp_path: Path) -> None:
    node = devstack.RedisNode(tmp_path)
    node.daemon.pid_file.write_text(f"{os.getpid()}\n")  # pytest itself, not redis-server
    assert not node.running()
    assert not node.daemon.pid_file.exists()


def test_redis_with_a_password(tmp_path: Path) -> None:
    password = devstack.random_password()
    node = devstack.start_test_redis(tmp_path, password=password)
    try:
        assert password in node.url
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=node.port).ping()
        assert redis.Redis.from_url(node.url).ping()
    finally:
        node.stop()
    assert not node.running()


def test_redis_restart_keeps_keys(tmp_path: Path) -> None:
    node = devstack.start_test_redis(tmp_path)
    try:
        redis.Redis.from_url(node.url).set("k", "v")
        node.restart()
        assert redis.Redis.from_url(node.url).get("k") == b"v"
    finally:
        node.stop()


def test_kafka_cluster_ids_look_like_kafkas() -> None:
    ids = {devstack.kafka_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_session_fixtures_give_a_topic_and_keys(
        unique_topic: Callable[..., str], settings: Settings,
        redis_client: redis.Redis) -> None:
    topic = unique_topic(partitions=3)
    assert topic.startswith(settings.prefix)
    produce(settings.kafka_bootstrap, topic, [b"a", b"b", b"c"])
    assert sorted(consume_all(settings.kafka_bootstrap, topic, 3)) == [b"a", b"b", b"c"]
    redis_client.set(settings.names.redis_key("probe"), "1")
    assert redis_client.get(settings.names.redis_key("probe")) == b"1"


def test_wait_until_returns_the_value_and_fails_with_the_message() -> None:
    assert wait_until(lambda: 42, 1, "answer") == 42
    with pytest.raises(AssertionError, match="never true"):
        wait_until(lambda: False, 0.2, "never true")


def test_a_relative_data_dir_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert devstack.KafkaNode(Path("rel/kafka")).data_dir == tmp_path / "rel" / "kafka"
    node = devstack.RedisNode(Path("rel/redis"), port=devstack.free_port())
    node.start()
    try:
        assert node.healthy()
    finally:
        node.stop()


def test_up_only_postgres_starts_it_alone(tmp_path: Path, ports: dict[str, int]) -> None:
    """What ``asynctier demo`` does when Kafka answers but no PostgreSQL does."""
    root = devstack.postgres_data_root(tmp_path)
    stack = devstack.DevStack(root / "data", ports["kafka"], ports["controller"],
                              ports["redis"], postgres_port=ports["postgres"])
    try:
        statuses = stack.up(only=("postgres",))
        assert [(s.name, s.started_now) for s in statuses] == [("postgres", True)]
        assert devstack.postgres_answers(stack.postgres.dsn, timeout_s=5.0)
        assert not stack.kafka.running() and not stack.redis.running()
    finally:
        stack.down()
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)


def test_missing_binaries_of_the_chosen_services_only(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    stack = devstack.DevStack(tmp_path / "data", cache_dir=tmp_path / "cache", path=str(empty))
    with pytest.raises(ServiceError) as caught:
        stack.up(only=("postgres",))
    message = str(caught.value)
    assert "apt-get install -y postgresql" in message
    assert "java" not in message and "redis" not in message


def test_up_with_tracing_starts_jaeger_and_points_the_shell_at_it(tmp_path: Path) -> None:
    stack = devstack.DevStack.resolve(tmp_path / "data")
    try:
        [status] = stack.up(only=(), tracing=True)
        assert status.name == "jaeger" and status.started_now
        assert stack.jaeger.services() is not None  # its query API answers
        assert "jaeger" in [s.name for s in stack.status()]
        assert any("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317" in line
                   for line in stack.env_lines())
    finally:
        assert ("jaeger", True) in stack.down()
    assert not stack.jaeger.running()
