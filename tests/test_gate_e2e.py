"""The accuracy gate over a real server (docs/versions.md "Accuracy gate", issue 37).

One ``servehall serve`` subprocess serves the demo model (torch ``cpu`` backend) as
``demo@v1`` with config revisions on a SQLite database. v1's own greedy answers
(``/v1/completions``, temperature 0) are the golden file's references; a version ``v2`` of
the same weights gated on it (exact, min 1.0) is added live and takes traffic; a version
``v3`` whose references are wrong is refused — by ``POST /admin/config`` and as a
revision stored by ``servehall config apply`` — never receives a request, and its
refusal is in ``config history`` and the audit log (with the figures) and the chain
verifies.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import run_sql
from tests.conftest import ServerHandle, dump_toml, run_cli

HEADER = "x-servehall-model-version"
PROMPTS = ["Once upon a time", "The cat", "hello there"]
MAX_TOKENS = 6


def gate_config(model_dir: Path, db_url: str, versions: list[dict[str, Any]]) -> str:
    """``demo`` served as ``versions`` (each: version, weight, optional gate) on torch."""
    return dump_toml(
        {
            "plugins": {"enabled": []},
            "server": {"config_revisions": True, "config_poll_s": 0.5},
            "database": {"url": db_url, "auto_migrate": True},
            "sinks": [{"name": "sql"}],
            "models": [
                {"name": "demo", "path": str(model_dir), "backend": "cpu", **v} for v in versions
            ],
        }
    )


class Deployment:
    def __init__(self, server: ServerHandle, db_url: str, model_dir: Path, work: Path) -> None:
        self.server, self.db_url, self.model_dir, self.work = server, db_url, model_dir, work

    def config(self, *versions: dict[str, Any]) -> str:
        return gate_config(self.model_dir, self.db_url, list(versions))

    def cli(self, *args: str, timeout_s: float = 120.0) -> Any:
        return run_cli(self.server.config_path, *args, env={}, cwd=self.work, timeout_s=timeout_s)

    def rows(self, sql: str) -> list[Any]:
        return asyncio.run(run_sql(self.db_url, sql))


V1 = {"version": "v1", "weight": 1}


@pytest.fixture(scope="module")
def dep(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    work = tmp_path_factory.mktemp("gate")
    db_url = f"sqlite+aiosqlite:///{work / 'g.db'}"
    with servehall_server(gate_config(demo_model_dir, db_url, [V1]), name="gate") as srv:
        yield Deployment(srv, db_url, demo_model_dir, work)


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def gate(golden: Path, min_: float) -> dict[str, Any]:
    return {"golden": str(golden), "metric": "exact", "min": min_, "max_tokens": MAX_TOKENS}


def test_gated_versions_pass_or_never_serve(dep: Deployment) -> None:
    url = dep.server.base_url
    body = {"model": "demo", "max_tokens": MAX_TOKENS, "temperature": 0}
    golden = dep.work / "golden.jsonl"
    with httpx.Client(timeout=120) as c:
        refs = []
        for prompt in PROMPTS:
            r = c.post(url + "/v1/completions", json={**body, "prompt": prompt})
            assert r.status_code == 200, r.text
            refs.append(r.json()["choices"][0]["text"])
    assert all(refs)
    golden.write_text(
        "".join(
            json.dumps({"prompt": p, "reference": a}) + "\n"
            for p, a in zip(PROMPTS, refs, strict=True)
        )
    )
    wrong = dep.work / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({"prompt": q, "reference": "no"}) + "\n" for q in PROMPTS))

    with httpx.Client(timeout=120) as c:
        # a version gated on v1's own answers passes and takes traffic
        text = dep.config(V1, {"version": "v2", "weight": 1, "gate": gate(golden, 1.0)})
        r = c.post(url + "/admin/config", json={"text": text})
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["demo@v2"]
        seen = set()
        for i in range(16):
            short = {**body, "prompt": PROMPTS[0], "max_tokens": 1, "user": f"u{i}"}
            r = c.post(url + "/v1/completions", json=short)
            assert r.status_code == 200, r.text
            seen.add(r.headers[HEADER])
        assert seen == {"v1", "v2"}
        # v2 answers as v1 did (greedy, the same weights)
        r = c.post(
            url + "/v1/completions", json={**body, "prompt": PROMPTS[1]}, headers={HEADER: "v2"}
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs[1], r.text

        # wrong references: refused whole, with the figures; v3 never exists
        bad = dep.config(
            V1,
            {"version": "v2", "weight": 1, "gate": gate(golden, 1.0)},
            {"version": "v3", "weight": 100, "gate": gate(wrong, 0.5)},
        )
        r = c.post(url + "/admin/config", json={"text": bad})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "nothing changed" in msg
        assert "accuracy gate of demo@v3 failed: exact 0.000 < min 0.500 over 3 prompts" in msg
        ready = c.get(url + "/health/ready").json()
        assert set(ready["models"]) == {"demo@v1", "demo@v2"}
        assert ready["config"]["revision"] == 2
        r = c.post(url + "/v1/completions", json={**body, "prompt": "x"}, headers={HEADER: "v3"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_version_not_found"

    # the same config stored by `config apply`: the replica refuses revision 3
    bad_file = dep.work / "bad.toml"
    bad_file.write_text(bad)
    p = dep.cli("config", "apply", str(bad_file))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("revision 3 ")

    def refused_rev3() -> bool:
        rows = dep.rows("SELECT target FROM audit_event WHERE action = 'config.refused'")
        return [t for (t,) in rows] == ["config", "revision 3"]

    wait_for(refused_rev3, 90, "revision 3 refused by the replica")
    with httpx.Client(timeout=30) as c:
        ready = c.get(url + "/health/ready").json()
        assert set(ready["models"]) == {"demo@v1", "demo@v2"}
        assert "revision 3" in ready["config"]["last_error"]
        assert "accuracy gate of demo@v3 failed" in ready["config"]["last_error"]

    hist = dep.cli("config", "history")
    assert hist.returncode == 0, hist.stderr
    lines = hist.stdout.splitlines()
    refused = [ln for ln in lines if ln.startswith("refused")]
    assert len(refused) == 2, hist.stdout
    assert "revision 3" in refused[0] and "accuracy gate of demo@v3 failed" in refused[0]
    assert "direct apply" in refused[1] and "api:anonymous" in refused[1]
    js = [json.loads(line) for line in dep.cli("config", "history", "--json").stdout.splitlines()]
    figures = next(e for e in js if e.get("refused"))["gates"]["demo@v3"]
    assert figures["score"] == 0.0 and figures["min"] == 0.5 and figures["prompts"] == 3
    assert [s for _, s in figures["per_prompt"]] == [0.0, 0.0, 0.0]

    # the audit log: each gate run with its figures; v3 never served a request
    def gate_events() -> list[tuple[str, str]]:
        sql = "SELECT action, target FROM audit_event WHERE action LIKE 'model.gate%' ORDER BY id"
        return [(a, t) for a, t in dep.rows(sql)]

    wait_for(lambda: len(gate_events()) >= 3, 30, "the gate runs audited")
    events = gate_events()
    assert ("model.gate_passed", "demo@v2") in events
    assert events.count(("model.gate_failed", "demo@v3")) == 2
    assert not dep.rows("SELECT 1 FROM request_log WHERE version = 'v3'")
    v = dep.cli("audit", "verify")
    assert v.returncode == 0, v.stdout + v.stderr
