"""The Helm chart (deploy/helm/asynctier), checked without a cluster: `helm lint`, `helm
template` with several value sets, the manifests against Kubernetes' API types (kubecheck),
and what they say against what the code serves and reads."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from asynctier.cli.console import options_from_env
from asynctier.console.app import STOP_GRACE_S as CONSOLE_STOP_GRACE_S
from asynctier.dev.gotools import KUBECHECK
from asynctier.platform import metrics
from asynctier.platform.config import DEFAULT_SCHEDULER, KAFKA_ENV
from asynctier.platform.health import HEALTHZ_PATH, READYZ_PATH
from asynctier.platform.names import Names
from asynctier.platform.rpcsecurity import ENV as RPC_ENV
from asynctier.scheduler.options import SchedulerOptions, options_from_settings
from asynctier.scheduler.resolver import FunctionResolver
from asynctier.submitter.server import STOP_GRACE_S as SUBMITTER_STOP_GRACE_S
from asynctier.tailers.manager import STOP_TIMEOUT_S as TAILERS_STOP_S
from tests.deploy.chart import (
    ALL_ON,
    ALL_ON_VALUES,
    CHART,
    EXAMPLE,
    PROCESSES,
    ROOT,
    VALUES,
    containers,
    deployment,
    of_kind,
    render,
    rendered_env,
    rendered_settings,
    template,
)

#: The keys under `roles` in values.yaml: a role each, the urgent tier's scheduler, and the
#: console (off by default: it needs a login token).
ROLE_VALUES = {"scheduler", "schedulerUrgent", "tailers", "delay", "submitter", "console"}


def made(docs: list[dict[str, Any]]) -> list[str]:
    """The Deployments a rendering makes, by their names after the release's."""
    return [name.removeprefix("t-asynctier-") for name in of_kind(docs, "Deployment")]


@pytest.fixture(scope="module", params=["default", "all-on"])
def docs(request: pytest.FixtureRequest, helm: Path) -> list[dict[str, Any]]:
    return render(helm) if request.param == "default" else render(helm, ALL_ON)


# ----------------------------------------------------------------------------- helm itself


@pytest.mark.parametrize("values", [(), (ALL_ON,), (EXAMPLE / "values.yaml",)],
                         ids=["default", "all-on", "example"])
def test_helm_lint_is_clean(helm: Path, values: tuple[Path, ...]) -> None:
    argv = [str(helm), "lint", "--strict", str(CHART)]
    for path in values:
        argv += ["-f", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


def test_manifests_are_valid_kubernetes_objects(helm: Path) -> None:
    kubecheck = KUBECHECK.ensure()
    for values in ((), (ALL_ON,)):
        out = template(helm, *values).stdout
        done = subprocess.run([str(kubecheck)], input=out, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("ok Deployment") == len(PROCESSES) + (1 if values else 0)
        assert "invalid" not in done.stdout
    planted = out.replace("readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", 1)
    done = subprocess.run([str(kubecheck)], input=planted, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and 'unknown field "spec.template.spec.containers[0]' \
        '.securityContext.readOnlyRootFileSystem"' in done.stdout


# ------------------------------------------------------------------------- what pods get


def test_a_deployment_per_process_of_a_bare_asynctier_run(docs: list[dict[str, Any]]) -> None:
    """A tailers Deployment per priority tier and a scheduler kept for the urgent tier, as
    `asynctier run` starts them (docs/operations.md, "Processes per tier")."""
    assert set(VALUES["roles"]) == ROLE_VALUES
    assert set(made(docs)) - {"console"} == set(PROCESSES)
    for name, (component, tier) in PROCESSES.items():
        container = deployment(docs, name)["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["run", component] + (["--tier", tier] if tier else [])
        assert container["name"] == name


def test_tiers_can_be_left_together(helm: Path) -> None:
    docs = render(helm, sets=("roles.tailers.tiers=null", "roles.schedulerUrgent.enabled=false"))
    assert set(made(docs)) == {"scheduler", "tailers", "delay", "submitter"}
    container = deployment(docs, "tailers")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["run", "tailers"]
    docs = render(helm, sets=("roles.tailers.tiers={batch}",))
    assert {name for name in made(docs) if name.startswith("tailers")} == {"tailers-batch"}
    done = template(helm, sets=("roles.tailers.tiers={urgent,bulk}",), check=False)
    assert done.returncode != 0 and "/roles/tailers/tiers/1" in done.stderr


def test_probes_ask_the_paths_and_port_the_processes_serve(docs: list[dict[str, Any]],
                                                          tmp_path: Path) -> None:
    for role in PROCESSES:
        container = deployment(docs, role)["spec"]["template"]["spec"]["containers"][0]
        port = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
        assert rendered_settings(docs, role, tmp_path).metrics_port == port
        probes = {name: container[f"{name}Probe"]["httpGet"]
                  for name in ("startup", "liveness", "readiness")}
        assert probes["liveness"] == probes["startup"] == {"path": HEALTHZ_PATH,
                                                           "port": "metrics"}
        assert probes["readiness"] == {"path": READYZ_PATH, "port": "metrics"}


def test_the_console_serves_its_probes_and_pages_on_its_port(helm: Path) -> None:
    docs = render(helm, ALL_ON)
    container = deployment(docs, "console")["spec"]["template"]["spec"]["containers"][0]
    options = options_from_env(rendered_env(docs, "console")).check()
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": options.host_port()[1]}
    assert options.read_only is True  # all-on sets roles.console.readOnly
    assert options.token == ALL_ON_VALUES["secrets"]["consoleToken"]
    for probe in ("startup", "liveness", "readiness"):
        assert container[f"{probe}Probe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    annotations = deployment(docs, "console")["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations  # it serves no /metrics


def test_the_console_needs_a_long_token_and_one_replica(helm: Path) -> None:
    on = ("roles.console.enabled=true",)
    done = template(helm, sets=on, check=False)
    assert done.returncode != 0 and "secrets.consoleToken: the console's login" in done.stderr
    done = template(helm, sets=(*on, "secrets.consoleToken=short"), check=False)
    assert done.returncode != 0 and "give 16 characters or more" in done.stderr
    done = template(helm, sets=(*on, "secrets.consoleToken=0123456789abcdef",
                                "roles.console.replicas=2"), check=False)
    assert done.returncode != 0 and "/roles/console/replicas" in done.stderr
    assert "t-asynctier-console" not in of_kind(render(helm), "Deployment")


def test_the_config_map_is_a_config_the_code_reads(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, ALL_ON)
    settings = rendered_settings(docs, "scheduler", tmp_path)
    config = ALL_ON_VALUES["config"]
    assert settings.prefix == config["prefix"]
    assert settings.allow_modules == tuple(config["allowModules"])
    assert settings.region == config["region"]
    assert settings.scheduler_listen == "10.1.2.3:50051"  # the pod's own IP, registered
    assert settings.schedulers == ("t-asynctier-scheduler:50051",)
    assert settings.submitters == ("t-asynctier-submitter:50061",)
    options = options_from_settings(settings)
    assert (options.workers, options.max_queued_items) == (16, 40000)
    traced = config["tracing"]
    assert settings.tracing.enabled and settings.tracing.endpoint == traced["endpoint"]
    assert settings.tracing.sample_ratio == traced["sampleRatio"]
    assert settings.tracing.trace_link("ab") == traced["traceUrl"].replace("{trace_id}", "ab")
    pod = deployment(docs, "scheduler")["spec"]["template"]["spec"]
    mounted = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    for path in (settings.rpc.ca, settings.rpc.cert, settings.rpc.key):
        assert str(Path(str(path)).parent) == mounted["rpc-tls"]
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        assert str(Path(settings.kafka[key]).parent) == mounted["kafka-tls"]


def test_every_container_is_non_root_read_only_with_resources(
        docs: list[dict[str, Any]]) -> None:
    user = dockerfile_user(ROOT / "Dockerfile")
    found = 0
    for pod, container in containers(docs):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == user
        assert pod["automountServiceAccountToken"] is False
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        resources = container["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"}
        assert "memory" in resources["limits"] and "cpu" not in resources["limits"]
        tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
        assert {"name": tmp["name"], "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
        found += 1
    assert found == len(made(docs))


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def test_memory_follows_the_measured_peaks() -> None:
    """bench/RESULTS.md's Memory table (and its console section): the requests hold the
    peak RSS measured at the largest size, the limits twice it."""
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    table = text.split("## Memory", 1)[1].split("\n\n", 2)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines()[2:]]
    peaks = {"tailers": max(float(r[2]) for r in rows),
             "scheduler": max(float(r[3]) for r in rows)}
    peaks["schedulerUrgent"] = peaks["scheduler"]
    console = re.search(r"The console process's peak RSS[^*]*\*\*(\d+) MiB", text)
    assert console, "RESULTS.md's console section gives no peak RSS"
    peaks["console"] = float(console.group(1)) * 1.048  # MiB, as the table's MB
    for role, peak_mb in peaks.items():
        resources = VALUES["roles"][role]["resources"]
        assert mebibytes(resources["requests"]["memory"]) * 1.048 >= peak_mb
        assert mebibytes(resources["limits"]["memory"]) * 1.048 >= 2 * peak_mb


# --------------------------------------------------------------------------- graceful stop


def grace(docs: list[dict[str, Any]], role: str) -> int:
    return int(deployment(docs, role)["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"])


def test_the_chart_default_bounds_are_the_codes() -> None:
    drain = VALUES["drain"]
    assert drain["schedulerStopGraceSeconds"] == SchedulerOptions().stop_grace_s
    assert drain["submitterStopGraceSeconds"] == SUBMITTER_STOP_GRACE_S
    assert drain["tailersStopSeconds"] == TAILERS_STOP_S
    assert drain["consoleStopSeconds"] == CONSOLE_STOP_GRACE_S


@pytest.mark.parametrize("longest, margin, pre_stop", [(30, 10, 5), (600, 20, 0), (5, 1, 3)])
def test_grace_follows_the_drain_and_the_longest_binding_timeout(
        helm: Path, tmp_path: Path, longest: int, margin: int, pre_stop: int) -> None:
    docs = render(helm, sets=(f"drain.longestBindingTimeoutSeconds={longest}",
                              f"drain.marginSeconds={margin}",
                              f"drain.preStopSleepSeconds={pre_stop}",
                              "roles.console.enabled=true",
                              "secrets.consoleToken=0123456789abcdef"))
    stop_grace = options_from_settings(
        rendered_settings(docs, "scheduler", tmp_path)).stop_grace_s
    assert stop_grace == max(SchedulerOptions().stop_grace_s, longest)
    assert grace(docs, "scheduler") == grace(docs, "scheduler-urgent") == \
        pre_stop + stop_grace + margin
    assert grace(docs, "submitter") == pre_stop + SUBMITTER_STOP_GRACE_S + margin
    for name in ("tailers-urgent", "tailers-normal", "tailers-batch", "delay"):
        assert grace(docs, name) == TAILERS_STOP_S + margin
    assert grace(docs, "console") == CONSOLE_STOP_GRACE_S + margin
    for role in ("scheduler", "submitter"):
        hook = deployment(docs, role)["spec"]["template"]["spec"]["containers"][0].get(
            "lifecycle")
        assert (hook["preStop"]["sleep"]["seconds"] if hook else 0) == pre_stop


# ----------------------------------------------------------------------------- secrets


SECRET_VALUES = {"redis-url": "redis-secret-1", "queue-shards": "pg-secret-2",
                 "kafka-sasl-username": "sasl-user-3", "kafka-sasl-password": "sasl-secret-4",
                 "rpc-token": "rpc-secret-5", "console-token": "console-secret-6"}


def test_secrets_reach_the_processes_and_no_config_map(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, ALL_ON)
    (secret,) = of_kind(docs, "Secret").values()
    for key, marker in SECRET_VALUES.items():
        assert marker in secret["stringData"][key]
        for doc in docs:
            if doc["kind"] != "Secret":
                assert marker not in yaml.safe_dump(doc), f"{marker} is in a {doc['kind']}"
    for role in PROCESSES:
        settings = rendered_settings(docs, role, tmp_path)
        assert "redis-secret-1" in settings.redis_url
        assert len(settings.queue_shards) == 2
        assert all("pg-secret-2" in shard for shard in settings.queue_shards)
        assert settings.kafka["sasl.username"] == "sasl-user-3"
        assert settings.kafka["sasl.password"] == "sasl-secret-4"
        assert settings.rpc.token == "rpc-secret-5"


def test_every_secret_is_used_by_every_pod(docs: list[dict[str, Any]]) -> None:
    wanted = set(of_kind(docs, "Secret"))
    wanted |= {VALUES["rpc"]["tls"]["secretName"]}
    config = next(iter(of_kind(docs, "ConfigMap").values()))["data"]["asynctier.toml"]
    if "ssl.ca.location" in config:
        wanted |= {ALL_ON_VALUES["kafkaTls"]["secretName"]}
    for pod, container in containers(docs):
        volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"]
                   if "secret" in v}
        mounted = {volumes[m["name"]] for m in container["volumeMounts"]
                   if m["name"] in volumes}
        from_env = {v["valueFrom"]["secretKeyRef"]["name"] for v in container["env"]
                    if "secretKeyRef" in v.get("valueFrom", {})}
        assert wanted <= mounted | from_env
    env_names = {v["name"] for _, c in containers(docs) for v in c["env"]}
    assert {*KAFKA_ENV, RPC_ENV["token"], "ASYNCTIER_REDIS_URL",
            "ASYNCTIER_QUEUE_SHARDS"} <= env_names


def test_a_password_in_the_kafka_config_is_refused(helm: Path) -> None:
    done = template(helm, sets=("config.kafka.sasl\\.password=hunter2",), check=False)
    assert done.returncode != 0
    assert "config.kafka.sasl.password is a secret and would land in a ConfigMap" \
        in done.stderr and "hunter2" not in done.stdout


def test_plaintext_rpc_mounts_no_certificates(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, sets=("rpc.insecure=true",))
    assert rendered_settings(docs, "tailers-normal", tmp_path).rpc.insecure is True
    for pod, _ in containers(docs):
        assert "rpc-tls" not in {v["name"] for v in pod["volumes"]}


def test_a_secret_of_ones_own_is_named_not_made(helm: Path) -> None:
    docs = render(helm, sets=("secrets.create=false", "secrets.name=mine"))
    assert not of_kind(docs, "Secret")
    for _, container in containers(docs):
        refs = {v["valueFrom"]["secretKeyRef"]["name"] for v in container["env"]
                if "secretKeyRef" in v.get("valueFrom", {})}
        assert refs == {"mine"}
    done = template(helm, sets=("secrets.create=false",), check=False)
    assert done.returncode != 0 and "secrets.name: name the Secret you made" in done.stderr


# --------------------------------------------------------------------- services and PDBs


def test_services_reach_the_grpc_servers_and_the_console(docs: list[dict[str, Any]]) -> None:
    services = of_kind(docs, "Service")
    assert set(services) == {f"t-asynctier-{r}" for r in ("scheduler", "submitter",
                                                           "console") if r in made(docs)}
    assert services["t-asynctier-scheduler"]["spec"]["ports"][0]["port"] == int(
        DEFAULT_SCHEDULER.rsplit(":", 1)[1])
    for name, service in services.items():
        role = name.removeprefix("t-asynctier-")
        pod = deployment(docs, role)["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert service["spec"]["ports"][0]["targetPort"] in {
            p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    # the schedulers' Service is the fallback of every tier's tailers: it leaves out the one
    # kept for the urgent tier
    urgent = deployment(docs, "scheduler-urgent")["spec"]["template"]["metadata"]["labels"]
    assert not services["t-asynctier-scheduler"]["spec"]["selector"].items() <= urgent.items()


def test_a_disruption_budget_per_role(docs: list[dict[str, Any]]) -> None:
    budgets = of_kind(docs, "PodDisruptionBudget")
    for role in PROCESSES:
        budget = budgets[f"t-asynctier-{role}"]["spec"]
        labels = deployment(docs, role)["spec"]["template"]["metadata"]["labels"]
        assert budget["maxUnavailable"] == 1
        assert budget["selector"]["matchLabels"].items() <= labels.items()


# -------------------------------------------------------------------------------- KEDA


def test_keda_objects_only_when_enabled(helm: Path) -> None:
    docs = render(helm)
    assert not [d for d in docs if d["apiVersion"].startswith("keda.sh/")]
    assert all("replicas" in d["spec"] for d in of_kind(docs, "Deployment").values())


def test_tailers_scale_per_tier_on_their_bindings_lag_up_to_the_partitions(
        helm: Path) -> None:
    docs = render(helm, ALL_ON)
    scaled = of_kind(docs, "ScaledObject")
    keda = ALL_ON_VALUES["autoscaling"]["keda"]["tailers"]
    names = Names(ALL_ON_VALUES["config"]["prefix"])
    tiers = {b.get("tier", "normal") for b in keda["bindings"]}
    assert tiers == {"urgent", "normal"}  # all-on leaves batch without a binding to scale on
    for tier in tiers:
        tailers = scaled[f"t-asynctier-tailers-{tier}"]["spec"]
        assert tailers["scaleTargetRef"]["name"] == f"t-asynctier-tailers-{tier}"
        bindings = [b for b in keda["bindings"] if b.get("tier", "normal") == tier]
        partitions = max(b["partitions"] for b in bindings)
        assert tailers["maxReplicaCount"] == min(keda["maxReplicas"], partitions)
        groups = {t["metadata"]["consumerGroup"]: t["metadata"] for t in tailers["triggers"]}
        assert set(groups) == {names.group(b["name"]) for b in bindings}
        for trigger in groups.values():
            assert trigger["lagThreshold"] == str(keda["lagThreshold"])
            assert trigger["allowIdleConsumers"] == "false"
        # KEDA owns the replica count of what it scales; helm leaves it alone
        assert "replicas" not in deployment(docs, f"tailers-{tier}")["spec"]
    assert "t-asynctier-tailers-batch" not in scaled
    assert deployment(docs, "tailers-batch")["spec"]["replicas"] == VALUES["roles"][
        "tailers"]["replicas"]
    assert "replicas" not in deployment(docs, "scheduler")["spec"]
    assert deployment(docs, "scheduler-urgent")["spec"]["replicas"] == 1
    assert deployment(docs, "delay")["spec"]["replicas"] == 1
    fewer = render(helm, ALL_ON, sets=("autoscaling.keda.tailers.maxReplicas=4",))
    assert of_kind(fewer, "ScaledObject")["t-asynctier-tailers-normal"]["spec"][
        "maxReplicaCount"] == 4
    together = render(helm, ALL_ON, sets=("roles.tailers.tiers=null",))
    tailers = of_kind(together, "ScaledObject")["t-asynctier-tailers"]["spec"]
    assert len(tailers["triggers"]) == len(keda["bindings"])
    assert tailers["maxReplicaCount"] == 12


def test_schedulers_scale_on_a_metric_they_export(helm: Path) -> None:
    docs = render(helm, ALL_ON)
    trigger = of_kind(docs, "ScaledObject")["t-asynctier-scheduler"]["spec"]["triggers"][0]
    metric = re.search(r"asynctier_[a-z_]+", trigger["metadata"]["query"])
    assert metric is not None and metric.group(0) in metrics.ALL_METRICS
    per_replica = int(trigger["metadata"]["threshold"])
    assert per_replica == ALL_ON_VALUES["config"]["scheduler"]["maxQueuedItems"] // 2
    auth = of_kind(docs, "TriggerAuthentication")["t-asynctier-kafka"]["spec"]
    assert {r["parameter"] for r in auth["secretTargetRef"]} == {
        "username", "password", "ca", "cert", "key"}


def test_keda_without_bindings_says_what_to_add(helm: Path) -> None:
    done = template(helm, sets=("autoscaling.keda.enabled=true",), check=False)
    assert done.returncode != 0 and "autoscaling.keda.tailers.bindings" in done.stderr


# ---------------------------------------------------------- Dockerfile, compose, example


def dockerfile_user(path: Path) -> int:
    users = re.findall(r"^USER\s+(\S+)", path.read_text(), re.M)
    return int(users[-1].split(":")[0])


def test_the_chart_runs_the_image_the_dockerfile_builds() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["asynctier"]' in dockerfile
    assert dockerfile_user(ROOT / "Dockerfile") == VALUES["podSecurityContext"]["runAsUser"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["x-platform"]["image"].split(":")[0] == VALUES["image"]["repository"]
    for role in ("scheduler", "delay", "submitter"):
        assert compose["services"][role]["command"] == ["run", role]
    compose_toml = tomllib.loads((ROOT / "deploy" / "asynctier" / "compose.toml").read_text())
    assert compose_toml["asynctier"]["metrics_port"] == VALUES["ports"]["metrics"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == pyproject["project"]["version"]


def test_the_example_image_builds_from_asynctiers_with_its_modules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    base = re.search(r"^ARG ASYNCTIER_IMAGE=(\S+)", dockerfile, re.M)
    assert base is not None
    assert base.group(1) == f"{VALUES['image']['repository']}:{chart['appVersion']}"
    assert "FROM ${ASYNCTIER_IMAGE}" in dockerfile
    assert dockerfile_user(EXAMPLE / "Dockerfile") == dockerfile_user(ROOT / "Dockerfile")
    for source in re.findall(r"^COPY\s+(\S+)", dockerfile, re.M):
        assert (EXAMPLE / source).exists(), f"COPY {source}: no such file beside it"
    allowed = yaml.safe_load((EXAMPLE / "values.yaml").read_text())["config"]["allowModules"]
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "greetings", raising=False)
    function = FunctionResolver(allowed).resolve("greetings:hello")
    assert function.is_async


def test_a_mistyped_value_is_refused_not_ignored(helm: Path) -> None:
    """A typo would leave a default in force unseen (a grace shorter than the drain)."""
    done = template(helm, sets=("drain.longestBindingTimeout=300",), check=False)
    assert done.returncode != 0
    assert "additional properties 'longestBindingTimeout' not allowed" in done.stderr
    done = template(helm, sets=("roles.tailers.replicas=two",), check=False)
    assert done.returncode != 0 and "/roles/tailers/replicas" in done.stderr
