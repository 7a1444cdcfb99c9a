"""docs/deploy.md and deploy/ agree with each other and with the config they deploy:
the Kubernetes example's grace period covers preStop + ``graceful_timeout_s``, its
probes use the health routes, it has a PodDisruptionBudget and file secrets; the
compose file runs two replicas, PostgreSQL, Redis and HAProxy with deploy/haproxy.cfg;
deploy/servehall.toml is a valid config (``config check``) with shared limits."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from servehall.config.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "deploy.md"
DEPLOY = ROOT / "deploy"


def _toml() -> dict[str, Any]:
    return tomllib.loads((DEPLOY / "servehall.toml").read_text())


def _k8s() -> dict[str, dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/deploy.md has no yaml example"
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if d]
    return {d["kind"]: d for d in docs}


def test_kubernetes_example_matches_the_config() -> None:
    k8s = _k8s()
    assert {"Deployment", "PodDisruptionBudget", "Service", "Secret"} <= set(k8s)
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    graceful = _toml()["server"]["graceful_timeout_s"]
    assert pod["terminationGracePeriodSeconds"] >= sleep + graceful
    # secrets as files, where deploy/servehall.toml reads them
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["secrets"] == "/run/secrets"
    secret_keys = set(k8s["Secret"]["stringData"])
    files = set(re.findall(r'file = "/run/secrets/(\w+)"', (DEPLOY / "servehall.toml").read_text()))
    assert files == secret_keys == {"database_url", "limits_url", "auth_pepper"}
    pdb = k8s["PodDisruptionBudget"]["spec"]
    assert pdb["selector"] == k8s["Deployment"]["spec"]["selector"]
    assert pdb["minAvailable"] < k8s["Deployment"]["spec"]["replicas"]


def test_compose_mirrors_the_tested_topology() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "replica-a", "replica-b", "haproxy"} <= set(services)
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in services["haproxy"]["volumes"]
    graceful = _toml()["server"]["graceful_timeout_s"]
    for name in ("replica-a", "replica-b"):
        grace = services[name]["stop_grace_period"]
        assert int(grace.rstrip("s")) >= graceful
    cfg = (DEPLOY / "haproxy.cfg").read_text()
    assert "option httpchk GET /health/ready" in cfg
    assert '"${SERVEHALL_A}"' in cfg and '"${SERVEHALL_B}"' in cfg
    # load-aware: each replica's agent port (docs/operations.md), set for both replicas
    assert "agent-check" in cfg
    env = services["haproxy"]["environment"]
    for name in ("replica-a", "replica-b"):
        bind = services[name]["environment"]["SERVEHALL_SERVER__AGENT_BIND"]
        port = bind.rpartition(":")[2]
        assert env[f"SERVEHALL_{name[-1].upper()}_AGENT_PORT"] == port


def test_deploy_config_is_valid_with_shared_limits(tmp_path: Path) -> None:
    text = (DEPLOY / "servehall.toml").read_text()
    for name, value in (
        ("database_url", "postgresql+asyncpg://u:p@db/servehall"),
        ("limits_url", "redis://redis:6379/0"),
        ("auth_pepper", "x" * 32),
    ):
        (tmp_path / name).write_text(value)
        text = text.replace(f"/run/secrets/{name}", str(tmp_path / name))
    (tmp_path / "s.toml").write_text(text)
    from servehall.server.bootstrap import load_deployment

    settings, _ = load_deployment(tmp_path / "s.toml")
    auth = settings.section("auth")
    assert auth.limits_url.get_secret_value() == "redis://redis:6379/0"
    assert auth.limits_on_error == "closed"
    assert settings.sinks[0].options["commit_wait_s"] > 0
    assert (
        load_settings(tmp_path / "s.toml")
        .database.url.get_secret_value()
        .startswith("postgresql+asyncpg://")
    )


def test_inference_pool_example_selects_the_deployment() -> None:
    """deploy/k8s/inferencepool.yaml selects the pods of docs/deploy.md's Deployment on
    their HTTP port, and its endpoint picker's default engine is the servehall mapping
    (the metric names themselves are checked live in tests/test_ops_metrics_e2e.py)."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "inferencepool.yaml").read_text())]
    by_kind = {d["kind"]: d for d in docs}
    pool = by_kind["InferencePool"]["spec"]
    deployment = _k8s()["Deployment"]["spec"]
    labels = deployment["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    (container,) = deployment["template"]["spec"]["containers"]
    assert [p["number"] for p in pool["targetPorts"]] == [
        p["containerPort"] for p in container["ports"]
    ]
    epp = yaml.safe_load(by_kind["ConfigMap"]["data"]["config.yaml"])
    assert epp["kind"] == "EndpointPickerConfig"
    (extractor,) = [p for p in epp["plugins"] if p["type"] == "core-metrics-extractor"]
    params = extractor["parameters"]
    assert params["defaultEngine"] in {e["name"] for e in params["engineConfigs"]}
    names = {p.get("name", p["type"]) for p in epp["plugins"]}
    refs = {r["pluginRef"] for prof in epp["schedulingProfiles"] for r in prof["plugins"]}
    refs |= {s["pluginRef"] for s in epp["dataLayer"]["sources"]}
    refs |= {x["pluginRef"] for s in epp["dataLayer"]["sources"] for x in s["extractors"]}
    assert refs <= names, refs - names


def test_dashboard_panels_are_laid_out_and_show_rejected_records() -> None:
    """deploy/grafana: unique panel ids, no two panels overlap, and the records
    quarantine counter has a panel (issue 33: a rejected row is visible)."""
    board = json.loads((DEPLOY / "grafana" / "servehall.json").read_text())
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    exprs = {t["expr"]: p for p in panels for t in p.get("targets", [])}
    (rejected,) = [p for e, p in exprs.items() if "servehall_records_rejected_total" in e]
    assert "quarantine" in rejected["description"]
