"""Rendering the Helm chart for the tests: `helm template` with value files and --set, and
what a rendered pod's process would read (its config file, its environment, its Secret)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from asynctier.cli.run import CHILDREN
from asynctier.platform.config import Settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "asynctier"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
EXAMPLE = ROOT / "deploy" / "helm" / "example"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
ALL_ON_VALUES = yaml.safe_load(ALL_ON.read_text())
#: The processes of a bare `asynctier run` (cli/run.py CHILDREN) by the name the chart's
#: Deployments and compose's services give them ("tailers urgent" runs as
#: `tailers-urgent`), as (component, tier).
PROCESSES = {name.replace(" ", "-"): (component, tier) for name, component, tier, _ in CHILDREN}


def template(helm: Path, *values: Path, sets: tuple[str, ...] = (),
             check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(helm), "template", "t", str(CHART)]
    for path in values:
        argv += ["-f", str(path)]
    for item in sets:
        argv += ["--set", item]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def render(helm: Path, *values: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template(helm, *values, sets=sets).stdout) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every Deployment."""
    for deployment in of_kind(docs, "Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield pod, container


def deployment(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return of_kind(docs, "Deployment")[f"t-asynctier-{role}"]


def rendered_env(docs: list[dict[str, Any]], role: str) -> dict[str, str]:
    """A role's process environment: its env with every secretKeyRef resolved from the
    rendered Secret (the pod's IP is 10.1.2.3)."""
    secret = next(iter(of_kind(docs, "Secret").values()), {}).get("stringData", {})
    env: dict[str, str] = {}
    pod = deployment(docs, role)["spec"]["template"]["spec"]
    for var in pod["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"].replace("$(POD_IP)", "10.1.2.3")
        elif "secretKeyRef" in var["valueFrom"] and var["valueFrom"]["secretKeyRef"][
                "key"] in secret:
            env[var["name"]] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
    return env


def rendered_settings(docs: list[dict[str, Any]], role: str, tmp: Path) -> Settings:
    """The Settings a role's process builds: the ConfigMap's file at the path its env
    names, and its env (:func:`rendered_env`)."""
    config = next(iter(of_kind(docs, "ConfigMap").values()))["data"]["asynctier.toml"]
    path = tmp / f"{role}.toml"
    path.write_text(config)
    env = rendered_env(docs, role)
    assert env["ASYNCTIER_CONFIG"] == "/etc/asynctier/asynctier.toml"
    pod = deployment(docs, role)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[env["ASYNCTIER_CONFIG"]]["subPath"] == "asynctier.toml"
    return Settings.load(path, env={k: v for k, v in env.items() if k != "ASYNCTIER_CONFIG"})
