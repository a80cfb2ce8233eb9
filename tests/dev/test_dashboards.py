"""The Grafana dashboards: every PromQL expression parses (promtool) and names only metrics
that asynctier exports; every panel is described in deploy/grafana/README.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asynctier.platform import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
README = REPO / "deploy" / "grafana" / "README.md"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"}
_GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}


def panels_of(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the panels' targets."""
    return [t["expr"] for p in panels_of(dashboard) for t in p.get("targets", []) if "expr" in t]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    """The queries of the dashboard's query variables (``label_values(...)``)."""
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def substitute(expr: str) -> str:
    """Replace Grafana variables by sample values so the text is plain PromQL."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)(?::\w+)?\}?",
                  lambda m: _GRAFANA_VARS.get(m.group(1), "x"), expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer, enough for ours)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', substitute(expr))  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end():].lstrip()
        if following.startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS, "no dashboard JSON under deploy/grafana/dashboards"


def test_the_lexer_finds_metric_names() -> None:
    expr = ('histogram_quantile(0.99, sum by (binding, le) (rate(asynctier_x_bucket'
            '{binding=~"$binding"}[$__rate_interval]))) / on (binding) group_left '
            'asynctier_y offset 5m or vector(0)')
    assert metric_names(expr) == {"asynctier_x_bucket", "asynctier_y"}
    assert metric_names('label_replace(a_b, "binding", "$1", "group", "[^.]+\\\\.(.+)")') \
        == {"a_b"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_expression_names_only_exported_metrics(path: Path) -> None:
    exported = metrics.exported_series_names()
    dashboard = _load(path)
    exprs = expressions(dashboard) + [
        re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q) for q in variable_queries(dashboard)]
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{expr!r} names {sorted(unknown)}, not defined in metrics.py"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_expression_parses(path: Path, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus)")
    exprs = expressions(_load(path))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr{i}", "expr": substitute(e)} for i, e in enumerate(exprs)]}]}
    file = tmp_path / "rules.yml"
    file.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(file)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_are_well_formed_and_described(path: Path) -> None:
    dashboard = _load(path)
    readme = README.read_text()
    ids = [p["id"] for p in panels_of(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels_of(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert f"**{panel['title']}**" in readme, \
            f"panel {panel['title']!r} is not described in {README.relative_to(REPO)}"
    assert dashboard["uid"] and dashboard["title"]


# --- against a live platform -----------------------------------------------------------


def _metrics_port(plat: Any, name: str) -> int | None:
    match = re.search(r"metrics on http://[^:/]+:(\d+)/metrics", plat.log(name))
    return int(match.group(1)) if match else None


def _wait_port(plat: Any, name: str) -> int:
    from tests.helpers import wait_until

    port = wait_until(lambda: _metrics_port(plat, name), 30, f"{name} printed its port")
    assert port is not None
    return port


def _scrape(port: int) -> tuple[set[str], set[str], str]:
    """(families declared, series names with samples, text) of one /metrics endpoint."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    families |= {f"{f}_total" for f in families}  # counters are declared without _total
    samples = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    return families, samples, text


QUEUE_METRICS = ("asynctier_queue_items", "asynctier_queue_oldest_ready_seconds",
                 "asynctier_queue_lease_expiries_total", "asynctier_queue_longest_run_seconds",
                 "asynctier_checkpoints_total", "asynctier_queue_leases_lost_total")


def test_the_queue_metrics_have_panels() -> None:
    """Depth by state, oldest ready age and lease expiries each have a panel, and so do
    the queue's acks, nacks and dead items (items_total of the queue bindings)."""
    used: dict[str, list[str]] = {}
    for path in DASHBOARDS:
        for panel in panels_of(_load(path)):
            for target in panel.get("targets", []):
                for name in metric_names(target.get("expr", "")):
                    used.setdefault(name, []).append(panel["title"])
    for name in QUEUE_METRICS:
        assert name in metrics.exported_series_names()
        assert used.get(name), f"no panel shows {name}"
    outcomes = [t["expr"] for path in DASHBOARDS for p in panels_of(_load(path))
                for t in p.get("targets", [])
                if "asynctier_items_total" in t.get("expr", "")
                and "asynctier_queue_items" in t["expr"]]
    assert any('outcome=~"ok|retry|dead_letter"' in e for e in outcomes), outcomes


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def test_a_live_platform_exports_what_the_dashboards_query(
        settings: Any, unique_topic: Any, tmp_path: Path, postgres: str,
        queue_namespace: str) -> None:
    from tests.funcs import ledger
    from tests.helpers import wait_until
    from tests.platform_harness import Platform, produce_json

    topic = unique_topic(partitions=2)
    plat = Platform(settings, tmp_path, allow=("tests.funcs.ledger",),
                    env={"ASYNCTIER_QUEUE_SHARDS": postgres})
    try:
        plat.cli("bind", "orders", "--topic", topic, "--function", "tests.funcs.ledger:record",
                 "--tenant", "acme")
        plat.cli("bind", "jobs", "--queue", "jobs", "--function", "tests.funcs.ledger:record",
                 "--tenant", queue_namespace)
        plat.start("scheduler", None, "--metrics-port", "0")
        plat.start("tailers", None, "--metrics-port", "0")
        produce_json(settings, topic, [{"id": i} for i in range(200)])
        lines = "".join(json.dumps({"id": 1000 + i}) + "\n" for i in range(50))
        plat.cli("enqueue", "jobs", "--namespace", queue_namespace, input=lines)
        wait_until(lambda: set(range(200)) | set(range(1000, 1050))
                   <= set(ledger.ids_seen(plat.ledger)), 60, "every record and item ran")
        ports = [_wait_port(plat, name) for name in ("scheduler", "tailers")]
        depth = {"binding": "jobs", "tenant": queue_namespace}
        wait_until(lambda: _sample(_scrape(ports[1])[2], "asynctier_queue_items",
                                   {**depth, "state": "ready"}) == 0, 30,
                   "the tailers export the queue's depth, drained")
        # the ledger line is written as an item starts: its ack comes a batch later
        wait_until(lambda: _sample(_scrape(ports[1])[2], "asynctier_items_total",
                                   {"binding": "jobs", "outcome": "ok"}) == 50, 30,
                   "the queue tailer's 50 acks counted in items_total")
        assert _sample(_scrape(ports[1])[2], "asynctier_queue_oldest_ready_seconds",
                       depth) == 0
        families: set[str] = set()
        samples: set[str] = set()
        texts = []
        for port in ports:
            fams, samps, text = _scrape(port)
            families |= fams
            samples |= samps
            texts.append(text)
    finally:
        plat.stop_all()

    wanted = {name for path in DASHBOARDS for expr in expressions(_load(path))
              for name in metric_names(expr)}
    declared = {n.removesuffix("_bucket") for n in wanted} - families
    assert not declared, f"dashboards query metrics no live process declares: {declared}"
    # With records flowing, the items counter carries binding, tenant and outcome.
    assert any('asynctier_items_total{binding="orders",outcome="ok",tenant="acme"}' in t
               for t in texts), "no items_total sample for the binding"
    assert "asynctier_batches_total" in samples
    missing = sorted(n for n in wanted if n not in samples)
    print(f"\nqueried by the dashboards, no sample yet in this run: {missing}")
