"""Issue #13 §3.10 against a real ``servehall serve``: every startup line is timestamped
(the OpenVINO conversion included), and the access log — off by default — writes one
line per request without secrets, query strings or prompt text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import demo_config

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
PROMPT_MARK = "PROMPT-TEXT-7f3a"
QUERY_MARK = "QUERY-SECRET-91c2"
HEADER_MARK = "HEADER-SECRET-44d0"


def test_startup_log_is_timestamped_and_access_log_has_no_secrets(
    servehall_server: Any, demo_model_dir: Path, tmp_path: Path
) -> None:
    cfg = demo_config(demo_model_dir, server={"access_log": True})
    # a fresh cache: the server converts the model to OpenVINO IR and says so in the log
    env = {"SERVEHALL_CACHE_DIR": str(tmp_path / "cache")}
    with servehall_server(cfg, name="access-log", env=env, ready_timeout=600) as srv:
        base = srv.base_url
        r = httpx.post(
            base + "/v1/chat/completions",
            json={
                "model": "demo",
                "messages": [{"role": "user", "content": PROMPT_MARK}],
                "max_tokens": 3,
            },
            timeout=60,
        )
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        with httpx.stream(
            "POST",
            base + "/v1/completions",
            json={"model": "demo", "prompt": PROMPT_MARK, "max_tokens": 3, "stream": True},
        ) as s:
            assert s.status_code == 200
            s.read()
        assert (
            httpx.get(
                base + f"/v1/models?api_key={QUERY_MARK}",
                headers={"Authorization": f"Bearer {HEADER_MARK}", "X-API-Key": HEADER_MARK},
                timeout=60,
            ).status_code
            == 200
        )
        assert httpx.get(base + "/nope", timeout=60).status_code == 404
        srv.stop()
        log = srv.log_text()
    startup = log.split("Running on", 1)[0].splitlines()
    assert any(" converting " in line and "to OpenVINO IR" in line for line in startup), log
    assert any(" converted " in line and "to OpenVINO IR" in line for line in startup), log
    unstamped = [line for line in startup if line.strip() and not STAMP.match(line)]
    assert unstamped == [], unstamped

    access = [line for line in log.splitlines() if " servehall.access: " in line]
    assert all(STAMP.match(line) for line in access)
    chat = [line for line in access if '"POST /v1/chat/completions HTTP/' in line]
    assert len(chat) == 1 and " 200 " in chat[0] and f"id={rid}" in chat[0], access
    assert re.search(r" \d+B \d+\.\dms id=", chat[0])
    assert any('"POST /v1/completions HTTP/' in line and " 200 " in line for line in access)
    models = [line for line in access if '"GET /v1/models HTTP/' in line]
    assert len(models) == 1 and "api_key" not in models[0], access
    assert any('"GET /nope HTTP/' in line and " 404 " in line for line in access)
    for mark in (PROMPT_MARK, QUERY_MARK, HEADER_MARK):
        assert mark not in log, mark


def test_access_log_is_off_by_default(servehall_server: Any, demo_model_dir: Path) -> None:
    cfg = demo_config(demo_model_dir)
    cfg["models"][0]["backend"] = "cpu"  # the torch engine: no OpenVINO conversion needed
    with servehall_server(cfg, name="no-access-log") as srv:
        assert httpx.get(srv.base_url + "/v1/models", timeout=60).status_code == 200
        assert httpx.get(srv.base_url + "/health/live", timeout=60).status_code == 200
        srv.stop()
        assert "servehall.access" not in srv.log_text()
