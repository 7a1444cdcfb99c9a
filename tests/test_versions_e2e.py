"""Model versions and live config over a real server (docs/versions.md, issue 24).

One ``servehall serve`` subprocess serves model ``m`` as versions of the ``null`` engine
(paced, in worker processes) with config revisions on a SQLite database; the tests run
in order on it: weighted sticky routing and the pin header, request-log rows and metrics
naming the version, a live change during 32 running streams, a bad config refused whole,
``config history`` / ``config rollback`` from the CLI, SIGHUP, and the audit chain.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import run_sql
from tests.conftest import ServerHandle, dump_toml, run_cli

HEADER = "x-servehall-model-version"


def versions_config(
    model_dir: Path,
    db_url: str,
    versions: list[tuple[str, float]],
    extra: dict[str, dict[str, Any]] | None = None,
    server: dict[str, Any] | None = None,
    more: dict[str, Any] | None = None,
) -> str:
    """A config serving ``m`` as ``versions`` (label, weight) of the paced null engine;
    ``extra`` adds keys to a version's entry by label, ``server`` to ``[server]``,
    ``more`` top-level sections (replacing ``[scheduler]`` too)."""
    return dump_toml(
        {
            "plugins": {"enabled": []},
            "server": {"config_revisions": True, "config_poll_s": 0.5, **(server or {})},
            "database": {"url": db_url, "auto_migrate": True},
            "sinks": [{"name": "sql"}],
            "scheduler": {"max_concurrency": 64, "max_queue": 256},
            **(more or {}),
            "models": [
                {
                    "name": "m",
                    "version": v,
                    "weight": w,
                    "path": str(model_dir),
                    "backend": "null",
                    "options": {"tokens_per_s": 40},
                    "worker": {"switch_interval_s": 0.001},
                    **(extra or {}).get(v, {}),
                }
                for v, w in versions
            ],
        }
    )


class Deployment:
    def __init__(self, server: ServerHandle, db_url: str, model_dir: Path, work: Path) -> None:
        self.server, self.db_url, self.model_dir, self.work = server, db_url, model_dir, work

    def config(
        self, versions: list[tuple[str, float]], extra: dict[str, dict[str, Any]] | None = None
    ) -> str:
        return versions_config(self.model_dir, self.db_url, versions, extra)

    def cli(self, *args: str) -> Any:
        return run_cli(self.server.config_path, *args, env={}, cwd=self.work)

    def rows(self, sql: str) -> list[Any]:
        return asyncio.run(run_sql(self.db_url, sql))


@pytest.fixture(scope="module")
def dep(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    work = tmp_path_factory.mktemp("versions")
    db_url = f"sqlite+aiosqlite:///{work / 'v.db'}"
    text = versions_config(demo_model_dir, db_url, [("v1", 90), ("v2", 10)])
    with servehall_server(text, name="versions") as srv:
        yield Deployment(srv, db_url, demo_model_dir, work)


def completion(user: str | None = None, max_tokens: int = 2, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "prompt": "hello there", "max_tokens": max_tokens}
    if user is not None:
        body["user"] = user
    return {**body, **kw}


def versions_seen(url: str, users: range, client: httpx.Client) -> dict[str, str]:
    out = {}
    for i in users:
        r = client.post(url + "/v1/completions", json=completion(f"u{i}"))
        assert r.status_code == 200, r.text
        out[f"u{i}"] = r.headers[HEADER]
    return out


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_weighted_sticky_split_pin_and_records(dep: Deployment) -> None:
    url = dep.server.base_url
    with httpx.Client(timeout=30) as c:
        models = c.get(url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["m"]
        first = versions_seen(url, range(300), c)
        share = sum(1 for v in first.values() if v == "v2") / len(first)
        assert 0.04 <= share <= 0.18, share  # 10 % of 300 users, binomial margins
        assert versions_seen(url, range(60), c) == {f"u{i}": first[f"u{i}"] for i in range(60)}
        # the pin header (anonymous callers hold every scope here)
        for v in ("v1", "v2"):
            r = c.post(url + "/v1/completions", json=completion("u0"), headers={HEADER: v})
            assert r.status_code == 200 and r.headers[HEADER] == v
        r = c.post(url + "/v1/completions", json=completion(), headers={HEADER: "v9"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_version_not_found"
        ready = c.get(url + "/health/ready").json()
        assert set(ready["models"]) == {"m@v1", "m@v2"}
        assert ready["config"]["revision"] == 1
        metrics = c.get(url + "/metrics").text
    assert "servehall_config_revision 1.0" in metrics
    assert 'version="v2"' in metrics and 'model="m"' in metrics

    def logged() -> bool:
        rows = dep.rows("SELECT version, COUNT(*) FROM request_log GROUP BY version")
        return {r[0] for r in rows} >= {"v1", "v2"}

    wait_for(logged, 10, "request_log rows naming both versions")


def _stream(url: str, results: list[Any]) -> None:
    try:
        with (
            httpx.Client(timeout=60) as c,
            c.stream(
                "POST", url + "/v1/completions", json=completion(max_tokens=80, stream=True)
            ) as r,
        ):
            text = "".join(r.iter_text())
            results.append((r.status_code, r.headers.get(HEADER), text))
    except Exception as exc:  # a cut stream is a failure the test reports
        results.append((0, None, repr(exc)))


def test_live_apply_during_32_streams_loses_nothing(dep: Deployment) -> None:
    import threading

    url = dep.server.base_url
    results: list[Any] = []
    threads = [threading.Thread(target=_stream, args=(url, results)) for _ in range(32)]
    for t in threads:
        t.start()
    time.sleep(0.8)  # streams are running (80 tokens at 40/s: ~2 s each)
    new = dep.config([("v1", 50), ("v3", 50)])  # v3 added, v2 removed, v1 reweighted
    with httpx.Client(timeout=120) as c:
        r = c.post(url + "/admin/config", json={"text": new})
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["added"] == ["m@v3"] and body["removed"] == ["m@v2"], body
    assert body["revision"] == 2
    for t in threads:
        t.join(60)
    assert len(results) == 32
    assert all(s == 200 and "[DONE]" in text for s, _, text in results), results
    with httpx.Client(timeout=30) as c:
        seen = set(versions_seen(url, range(80), c).values())
        assert seen == {"v1", "v3"}, seen

        def v2_gone() -> bool:
            return "m@v2" not in c.get(url + "/health/ready").json()["models"]

        wait_for(v2_gone, 20, "the removed version drained and stopped")
        ready = c.get(url + "/health/ready")
        assert ready.status_code == 200 and ready.json()["config"]["revision"] == 2


def test_bad_config_is_refused_whole_and_lists_every_error(dep: Deployment) -> None:
    url = dep.server.base_url
    bad = dep.config([("v1", 50), ("v3", -1), ("v1", 5)]).replace(
        "config_poll_s = 0.5", "config_poll_s = 0.7"
    )
    with httpx.Client(timeout=60) as c:
        r = c.post(url + "/admin/config", json={"text": bad})
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert "nothing changed" in msg
        assert "models[1].weight" in msg and "server.config_poll_s" in msg, msg
        assert "version 'v1' of model 'm' is already models[0]" in msg, msg
        ready = c.get(url + "/health/ready").json()
        assert ready["config"]["revision"] == 2
        assert set(versions_seen(url, range(40), c).values()) == {"v1", "v3"}
    # the CLI refuses it the same way, every error in one run
    bad_file = dep.work / "bad.toml"
    bad_file.write_text(bad)
    p = dep.cli("config", "apply", str(bad_file))
    assert p.returncode == 1 and "nothing applied" in p.stderr, p.stderr


def test_cli_apply_history_rollback_and_audit(dep: Deployment) -> None:
    url = dep.server.base_url
    f = dep.work / "v4.toml"
    f.write_text(dep.config([("v1", 0), ("v4", 1)]))
    p = dep.cli("config", "apply", str(f))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("revision 3 ")
    with httpx.Client(timeout=60) as c:

        def on(rev: int, versions: set[str]) -> bool:
            ready = c.get(url + "/health/ready").json()
            if ready["config"]["revision"] != rev:
                return False
            return set(versions_seen(url, range(20), c).values()) == versions

        wait_for(lambda: on(3, {"v4"}), 30, "revision 3 applied from the database")
        p = dep.cli("config", "rollback")
        assert p.returncode == 0, p.stderr
        assert "revision 4 = revision 2" in p.stdout
        t0 = time.monotonic()
        wait_for(lambda: on(4, {"v1", "v3"}), 30, "rollback to revision 2")
        assert time.monotonic() - t0 < 20
    hist = dep.cli("config", "history", "--json")
    assert hist.returncode == 0, hist.stderr
    rows = [json.loads(line) for line in hist.stdout.splitlines()]
    assert [r["revision"] for r in rows] == [4, 3, 2, 1]
    assert rows[0]["applied_by"].startswith("cli:") and rows[2]["applied_by"] == "api:anonymous"
    audit = dep.rows(
        "SELECT action, target FROM audit_event WHERE target LIKE 'revision %' ORDER BY id"
    )
    assert [a for a, _ in audit] == [
        "config.started",
        "config.applied",
        "config.applied",
        "config.rollback",
    ]
    v = dep.cli("audit", "verify")
    assert v.returncode == 0, v.stdout + v.stderr


def test_sighup_rereads_the_file(dep: Deployment) -> None:
    url = dep.server.base_url
    dep.server.config_path.write_text(dep.config([("v1", 1), ("v3", 0)]))
    dep.server.process.send_signal(signal.SIGHUP)
    with httpx.Client(timeout=60) as c:

        def only_v1() -> bool:
            return c.get(url + "/health/ready").json()["config"]["revision"] == 5

        wait_for(only_v1, 30, "SIGHUP applied as revision 5")
        assert set(versions_seen(url, range(30), c).values()) == {"v1"}
    assert "Traceback" not in dep.server.log_text()


def test_a_failing_canary_is_rolled_back_automatically_and_audited(dep: Deployment) -> None:
    url = dep.server.base_url
    canary = {
        "c": {
            # a canary built to fail: every 2nd request ends with an engine error
            "options": {"tokens_per_s": 40, "test_fail_every": 2},
            "rollback_if": {"error_rate_above": 0.1, "min_requests": 10, "window_s": 60},
        }
    }
    with httpx.Client(timeout=120) as c:
        r = c.post(url + "/admin/config", json={"text": dep.config([("v1", 1), ("c", 1)], canary)})
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["m@c"]
        served: list[tuple[int, str]] = []
        for i in range(400):
            r = c.post(url + "/v1/completions", json=completion(f"g{i}"))
            served.append((r.status_code, r.headers.get(HEADER, "")))
            tail = served[-30:]
            if len(tail) == 30 and all(s == 200 and v == "v1" for s, v in tail):
                break
        else:
            raise AssertionError(f"the canary kept traffic: {served[-40:]}")
        # it did fail before (an error response names its version too)
        assert any(s >= 500 and v == "c" for s, v in served), served
        metrics = c.get(url + "/metrics").text
        ready = c.get(url + "/health/ready")
        assert ready.status_code == 200
    assert any(
        line.startswith("servehall_canary_rollbacks_total{")
        and 'reason="error_rate"' in line
        and 'version="c"' in line
        and line.endswith(" 1.0")
        for line in metrics.splitlines()
    ), metrics
    assert "canary m@c rolled back (weight 0)" in dep.server.log_text()

    def audited() -> bool:
        rows = dep.rows(
            "SELECT target, details FROM audit_event WHERE action = 'model.canary_rollback'"
        )
        return len(rows) == 1 and rows[0][0] == "m@c"

    wait_for(audited, 10, "the model.canary_rollback audit event")
    v = dep.cli("audit", "verify")
    assert v.returncode == 0, v.stdout + v.stderr


def _children(pid: int) -> set[int]:
    """Process ids whose parent is ``pid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def test_idle_model_unloads_and_serves_after_a_cold_start(dep: Deployment) -> None:
    url = dep.server.base_url
    text = dep.config([("v1", 1)]) + (
        f'\n[[models]]\nname = "idle"\npath = "{dep.model_dir}"\nbackend = "null"\n'
        "idle_unload_s = 2.0\noptions = { tokens_per_s = 40 }\n"
    )
    pid = dep.server.process.pid
    with httpx.Client(timeout=120) as c:
        before = _children(pid)
        r = c.post(url + "/admin/config", json={"text": text})
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["idle"]
        loaded = _children(pid) - before
        assert loaded, "a worker process for the new model"
        body = {**completion(), "model": "idle"}
        assert c.post(url + "/v1/completions", json=body).status_code == 200

        def unloaded() -> bool:
            return c.get(url + "/health/ready").json()["models"]["idle"]["state"] == "unloaded"

        wait_for(unloaded, 15, "the idle model unloaded")
        ready = c.get(url + "/health/ready")
        assert ready.status_code == 200  # the replica stays ready
        assert ready.json()["models"]["idle"]["reason"] == "unloaded, loads on demand"
        wait_for(lambda: not (loaded & _children(pid)), 15, "its worker process gone")
        assert "idle" in [m["id"] for m in c.get(url + "/v1/models").json()["data"]]
        r = c.post(url + "/v1/completions", json=body)  # the cold start
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        metrics = c.get(url + "/metrics").text
    assert 'servehall_model_loads_total{model="idle",version=""} 2.0' in metrics, metrics
    assert 'servehall_model_state{model="idle",state="serving",version=""} 1.0' in metrics
