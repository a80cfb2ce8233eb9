"""docker-compose.yml cannot run here (no Docker engine): check that it holds together."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from asynctier import dev as devstack
from asynctier.platform.config import DEFAULT_SCHEDULER, DEFAULT_SUBMITTER, Settings
from tests.deploy.chart import PROCESSES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def host_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[0]) for p in service.get("ports", [])}


def mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    found = []
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            found.append((ROOT / source, target))
    return found


def test_every_service_is_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "redis", "postgres", "registry",
                                        "prometheus", "grafana", *PROCESSES}


def test_ports_agree_with_the_defaults(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert host_ports(services["kafka"]) == {devstack.DEFAULT_KAFKA_PORT}
    assert host_ports(services["redis"]) == {devstack.DEFAULT_REDIS_PORT}
    assert host_ports(services["postgres"]) == {devstack.DEFAULT_POSTGRES_PORT}
    assert host_ports(services["prometheus"]) == {9090}
    assert host_ports(services["grafana"]) == {3000}
    scheduler_port = int(DEFAULT_SCHEDULER.rsplit(":", 1)[1])
    assert host_ports(services["scheduler"]) == {scheduler_port} == {50051}
    assert host_ports(services["submitter"]) == {int(DEFAULT_SUBMITTER.rsplit(":", 1)[1])}
    assert Settings().kafka_bootstrap.endswith(":9092")
    assert Settings().redis_url.startswith("redis://127.0.0.1:6379")


def test_kafka_is_the_official_image_in_kraft_mode(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:4.")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "PLAINTEXT://localhost:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert str(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"
    assert "healthcheck" in kafka


def test_version_of_the_image_matches_the_dev_stack(compose: dict[str, Any]) -> None:
    image_version = compose["services"]["kafka"]["image"].split(":")[1]
    assert image_version == devstack.pom_kafka_version(devstack.default_pom())


def test_mounted_files_exist(compose: dict[str, Any]) -> None:
    seen = 0
    for name, service in compose["services"].items():
        for source, target in mounts(service):
            assert source.exists(), f"{name} mounts {source}, which does not exist"
            seen += 1
            if target.endswith((".yml", ".toml")):
                assert source.is_file(), f"{name}: {source} should be a file"
    assert seen >= 5


def test_platform_processes_run_the_cli(compose: dict[str, Any]) -> None:
    """A service per process of a bare `asynctier run`: a tailers process per priority tier
    and a scheduler kept for the urgent tier (docs/operations.md, "Processes per tier")."""
    services = compose["services"]
    for name, (component, tier) in PROCESSES.items():
        assert services[name]["command"] == ["run", component] + (
            ["--tier", tier] if tier else [])
        assert services[name]["build"] == "."
    # a scheduler listening on 0.0.0.0 registers its host name: the urgent one's is its own
    assert services["scheduler-urgent"]["hostname"] == "scheduler-urgent"
    assert (ROOT / "Dockerfile").is_file()
    assert 'ENTRYPOINT ["asynctier"]' in (ROOT / "Dockerfile").read_text()


def test_platform_config_points_inside_the_network(compose: dict[str, Any]) -> None:
    settings = Settings.from_file(ROOT / "deploy" / "asynctier" / "compose.toml")
    assert settings.kafka_bootstrap == "kafka:19092"
    assert "kafka:19092" in compose["services"]["kafka"]["environment"][
        "KAFKA_ADVERTISED_LISTENERS"]
    assert settings.redis_url == "redis://redis:6379/0"
    assert settings.scheduler_listen == "0.0.0.0:50051"
    assert settings.submitter_listen == "0.0.0.0:50061"
    assert settings.metrics_port > 0


def test_prometheus_scrapes_every_platform_process(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    port = tomllib.loads((ROOT / "deploy" / "asynctier" / "compose.toml").read_text())[
        "asynctier"]["metrics_port"]
    for name in PROCESSES:
        env = compose["services"][name]["environment"]
        assert int(env["ASYNCTIER_METRICS_PORT"]) == port
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert {f"{name}:{port}" for name in PROCESSES} <= targets


def test_grafana_is_provisioned() -> None:
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"
    boards = yaml.safe_load((provisioning / "dashboards" / "asynctier.yml").read_text())
    assert boards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (ROOT / "deploy" / "grafana" / "dashboards").is_dir()


def test_postgres_is_the_official_image_and_the_platform_uses_it(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres = services["postgres"]
    assert postgres["image"].split(":")[0] == "postgres"
    assert int(postgres["image"].split(":")[1]) >= 15
    env = postgres["environment"]
    assert (env["POSTGRES_USER"], env["POSTGRES_DB"]) == ("asynctier", "asynctier")
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert "postgres-data" in compose["volumes"]
    for name in PROCESSES:
        service = services[name]
        shards = service["environment"]["ASYNCTIER_QUEUE_SHARDS"]
        assert "@postgres:5432/asynctier" in shards
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        settings = Settings().from_env({"ASYNCTIER_QUEUE_SHARDS": shards})
        assert len(settings.queue_shards) == 1
    from_file = Settings.from_file(ROOT / "deploy" / "asynctier" / "compose.toml")
    assert from_file.queue_shards == (
        "postgresql://asynctier:asynctier@postgres:5432/asynctier",)
