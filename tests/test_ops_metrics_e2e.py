"""Every metric name used by an alert rule (deploy/prometheus/), a dashboard panel
(deploy/grafana/), an autoscaling query or an endpoint-picker metric spec (deploy/k8s/)
is on a live server's
``GET /metrics``, so a renamed metric fails the build instead of silently emptying a
panel or an alert (vLLM's dashboard went blank after its renames). Also checks the
operations families a real server exports: request errors by code, inter-token latency,
engine start time and last exit, sink gauges, config digest.

Names count as present when ``/metrics`` declares them (a ``# TYPE`` line: families whose
samples depend on the engine, like device memory or prefix-cache hits, are declared on
every server) or has a sample of that name; a histogram's ``_bucket``/``_sum``/``_count``
count for its family. Names a rule file records (``job_model:…``) count as present.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ServerHandle, demo_config

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*-rules.yaml"))
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
K8S = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))

# PromQL words that look like metric names: functions (followed by "(") are dropped by
# the parser below; these are keywords and aggregation modifiers.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"and", "or", "unless", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Drops string literals (label values), label matchers ``{…}``, label lists of ``by``/
    ``without``/``on``/``ignoring``/``group_*``, range and subquery brackets ``[…]``,
    Grafana variables (``$x``, ``${x}``), numbers and durations, and every identifier
    followed by ``(`` (a function or an aggregation). What remains are selectors.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\$\{?\w+\}?", "", e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def _rule_exprs() -> tuple[list[str], set[str]]:
    exprs: list[str] = []
    recorded: set[str] = set()
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                exprs.append(r["expr"])
                if "record" in r:
                    recorded.add(r["record"])
    return exprs, recorded


def _dashboard_exprs() -> list[str]:
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    out.append(v)
                elif k == "definition" and isinstance(v, str) and v.startswith("label_values"):
                    out.append(v.removeprefix("label_values(").rsplit(",", 1)[0])
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for f in DASHBOARDS:
        walk(json.loads(f.read_text()))
    return out


def _k8s_exprs() -> list[str]:
    """The Prometheus queries of the Kubernetes examples (KEDA triggers)."""
    out: list[str] = []
    for f in K8S:
        for doc in yaml.safe_load_all(f.read_text()):
            for trigger in (doc or {}).get("spec", {}).get("triggers", []):
                if trigger.get("type") == "prometheus":
                    out.append(trigger["metadata"]["query"])
    return out


PICKER_SPECS = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec")


def _picker_specs() -> dict[str, str]:
    """``{spec key: metric spec}`` of every ``engineConfigs`` entry in the endpoint-picker
    configurations (ConfigMaps holding an ``EndpointPickerConfig``) of deploy/k8s/."""
    out: dict[str, str] = {}
    for f in K8S:
        for doc in yaml.safe_load_all(f.read_text()):
            for text in ((doc or {}).get("data") or {}).values():
                cfg = yaml.safe_load(text)
                if not isinstance(cfg, dict) or cfg.get("kind") != "EndpointPickerConfig":
                    continue
                for plugin in cfg.get("plugins", []):
                    for engine in (plugin.get("parameters") or {}).get("engineConfigs", []):
                        for key in PICKER_SPECS:
                            if engine.get(key):
                                out[f"{f.name}:{engine['name']}.{key}"] = engine[key]
    return out


def exported_names(text: str) -> set[str]:
    """Names ``/metrics`` text declares or samples, with histogram series names."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind.strip() == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def test_the_parser_finds_selectors_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job, model, le) (rate(a_seconds_bucket{x="b c"}'
        "[5m] offset 1h))) > 1.5 * avg_over_time(rec:x:p99[1d:1m]) and on (model) "
        'b_total{model=~"$model"} / ignoring(le) c_bytes unless count without (x) (d)'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "rec:x:p99", "b_total", "c_bytes", "d"}


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., ServerHandle], demo_model_dir: Path, tmp_path_factory: Any
) -> Iterator[ServerHandle]:
    records = tmp_path_factory.mktemp("ops") / "records.jsonl"
    cfg = demo_config(demo_model_dir, sinks=[{"name": "jsonl", "options": {"path": str(records)}}])
    srv = servehall_server(cfg, name="ops-metrics", ready_timeout=600)
    with httpx.Client(base_url=srv.base_url, timeout=120) as c:
        r = c.post(  # five tokens whatever the demo weights (they depend on the CPU)
            "/v1/completions",
            json={"model": "demo", "prompt": "hi", "max_tokens": 5, "ignore_eos": True},
        )
        assert r.status_code == 200, r.text
        r = c.post("/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 404, r.text
    yield srv
    srv.stop()


def _metrics(srv: ServerHandle) -> str:
    return httpx.get(srv.base_url + "/metrics", timeout=30).text


def test_every_rule_and_panel_metric_is_exported(server: ServerHandle) -> None:
    rule_exprs, recorded = _rule_exprs()
    panel_exprs = _dashboard_exprs()
    k8s_exprs = _k8s_exprs()
    picker = _picker_specs()
    assert RULE_FILES and DASHBOARDS and len(panel_exprs) >= 30 and len(k8s_exprs) >= 2
    assert len(picker) == len(PICKER_SPECS), picker  # the InferencePool example's EPP
    # a picker spec is "name" or "name{label=value,…}" (llm-d-router's metric spec form)
    picker_names = {spec.split("{", 1)[0].strip() for spec in picker.values()}
    used = {n for e in rule_exprs + panel_exprs + k8s_exprs for n in metric_names(e)}
    used |= picker_names
    assert len(used) >= 30, sorted(used)
    exported = exported_names(_metrics(server))
    missing = sorted(used - exported - recorded)
    assert missing == [], f"used by deploy/ but not on /metrics: {missing}"
    # every recording rule's name is used somewhere (no dead recording rules)
    assert recorded <= used


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', head))
        if head.split("{")[0] == name and all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def test_operations_families_on_a_live_server(server: ServerHandle) -> None:
    text = _metrics(server)
    assert (
        _sample(
            text,
            "servehall_request_errors_total",
            status="404",
            code="model_not_found",
            endpoint="/v1/completions",
        )
        == 1.0
    )
    # 5 tokens: 4 gaps after the first
    assert _sample(text, "servehall_inter_token_latency_seconds_count", model="demo") == 4.0
    started = _sample(text, "servehall_engine_start_time_seconds", model="demo")
    assert started is not None and time.time() - 600 < started <= time.time()
    assert _sample(text, "servehall_engine_last_exit", model="demo", reason="none") == 1.0
    assert _sample(text, "servehall_engine_oom_kills_total", model="demo") == 0.0
    assert _sample(text, "servehall_engine_busy_silences_total", model="demo") == 0.0
    assert _sample(text, "servehall_engine_crash_loop", model="demo") == 0.0
    assert _sample(text, "servehall_sink_up", sink="jsonl", required="false") == 1.0
    assert _sample(text, "servehall_sink_refusing", sink="jsonl") == 0.0
    assert _sample(text, "servehall_audit_write_failures_total", sink="jsonl") == 0.0
    assert _sample(text, "servehall_config_revision") == 0.0
    assert re.search(r'^servehall_config_info\{sha256="[0-9a-f]{64}"\} 1\.0$', text, re.M)
    for outcome in ("valid", "invalid", "length", "refused"):
        value = _sample(
            text,
            "servehall_structured_output_requests_total",
            model="demo",
            kind="json_schema",
            outcome=outcome,
        )
        assert value == 0.0


def test_endpoint_picker_gauges_on_a_live_server(server: ServerHandle) -> None:
    """What the picker's specs read: one unlabelled series per replica-wide gauge (a spec
    without labels takes the first series of a family, so several would be ambiguous),
    and the KV-cache geometry as integer labels of ``servehall_cache_config_info``."""
    text = _metrics(server)
    for name in (
        "servehall_replica_requests_waiting",
        "servehall_replica_requests_running",
        "servehall_replica_kv_cache_usage_ratio",
    ):
        series = [line for line in text.splitlines() if line.split(" ")[0].split("{")[0] == name]
        assert series == [f"{name} 0.0"], series  # idle server
    (info,) = re.findall(r"^servehall_cache_config_info\{(.*)\} 1\.0$", text, re.M)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info))
    assert labels["model"] == "demo"
    assert int(labels["block_size"]) >= 1 and int(labels["num_gpu_blocks"]) >= 1, labels
