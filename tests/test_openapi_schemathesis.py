"""Case N30 and issue #13 §2: ``/openapi.json`` says what the server does.

Schemathesis (the real CLI, ``st run URL/openapi.json --checks all``) runs with a fixed
seed and a bounded number of examples against a real ``servehall serve`` — once without
and once with the auth plugin (with a key) — and must report no failure: no 5xx, every
response matching the document, every schema-invalid request refused and every
schema-valid one accepted (``positive_data_acceptance`` is replaced by the same check
that allows only the model-dependent 400s, see ``tests/schemathesis_hooks.py``).

Besides, the per-server document states what the validator refuses (a user message
without ``content``, ``stop`` with an empty string), the fields a backend refuses are
not in it, ``logprobs: 0`` is a request (400 ``unsupported_parameter``), and ``top_k`` /
``repetition_penalty`` are honoured while ``min_p`` is refused on ``openvino_cpu``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from schemathesis.core.warnings import SchemathesisWarning

from tests.conftest import ServerHandle, demo_config, run_cli

HERE = Path(__file__).parent
SEED = "20261130"
MAX_EXAMPLES = "8"
PEPPER = "schemathesis-pepper-" + uuid.uuid4().hex


def _st() -> str:
    exe = Path(sys.executable).parent / "st"
    found = str(exe) if exe.exists() else shutil.which("st")
    if not found:
        pytest.fail("schemathesis is not installed (requirements/dev.txt)")
    return found


def run_schemathesis(
    base_url: str, workdir: Path, *headers: str
) -> subprocess.CompletedProcess[str]:
    """``st run BASE/openapi.json --checks all`` (seeded, bounded) with the hooks module."""
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "NO_COLOR": "1",
    }
    args = [
        _st(),
        "run",
        f"{base_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--seed",
        SEED,
        "--max-examples",
        MAX_EXAMPLES,
        "--workers",  # one: hypothesis' ast.parse in threads trips a CPython 3.11 bug
        "1",
        "--request-timeout",
        "60",
        # every warning but missing test data: a stored response's id is a 404 until a
        # POST /v1/responses made it (the stateful phase follows that link)
        "--warnings",
        ",".join(w.value for w in SchemathesisWarning if w.value != "missing_test_data"),
    ]
    for h in headers:
        args += ["-H", h]
    # schemathesis keeps a .schemathesis/ folder in its working directory
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=workdir)


# POST /admin/config takes a whole config that differs from the running one only in
# [[models]]: no generated text is one, so every schema-valid body is a 400
# config_invalid (allowed by tests/schemathesis_hooks.py) and, where the caller has the
# admin scope (the anonymous principal without auth), schemathesis warns that the
# operation "mostly rejected generated data". With auth the key has only the inference
# scope (the fuzz cannot change the config), so both /admin/config operations answer only
# 403 and schemathesis warns that authentication failed for them. A per-operation
# warnings setting does not silence either (schemathesis 4.32 records them by the
# project-level setting), so exactly these warnings, for exactly these operations, are
# allowed.
ADMIN_MISMATCH = {
    "Schema validation mismatch: 1 operation mostly rejected generated data": ["POST /admin/config"]
}
ADMIN_FORBIDDEN = {
    "Authentication failed: 2 operations returned only 401/403 responses": [
        "GET /admin/config",
        "POST /admin/config",
    ]
}


def assert_clean(
    proc: subprocess.CompletedProcess[str], allowed: dict[str, list[str]] | None = None
) -> None:
    """No failure; no warning but ``allowed`` (warning line: the operations it lists)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-12000:]
    if "No issues found" in out:
        return
    assert allowed, out[-12000:]
    summary = out.rsplit("SUMMARY", 1)[-1]
    assert "Failures:" not in summary, out[-12000:]
    assert re.findall(r"^\s*⚠️ (.*)$", summary, flags=re.M) == list(allowed), out[-12000:]
    section = out.rsplit("WARNINGS", 1)[-1].split("SUMMARY", 1)[0]
    listed = re.findall(r"^\s*- (.*)$", section, flags=re.M)
    assert listed == [op for ops in allowed.values() for op in ops], out[-12000:]


@pytest.fixture(scope="module")
def plain(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    # a migrated database: /v1/responses stores responses by default
    db = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('st') / 'st.db'}"
    cfg = demo_config(demo_model_dir, database={"url": db, "auto_migrate": True})
    with servehall_server(cfg, name="openapi-plain") as srv:
        yield srv


def test_schemathesis_finds_nothing_without_auth(plain: ServerHandle, tmp_path: Path) -> None:
    before = httpx.get(plain.base_url + "/admin/config", timeout=60).json()
    assert_clean(run_schemathesis(plain.base_url, tmp_path), ADMIN_MISMATCH)
    assert "Traceback" not in plain.log_text()
    # the fuzz posted to /admin/config as the anonymous principal (admin scope): no text it
    # sent changed the running config (a valid one must equal it outside [[models]])
    assert httpx.get(plain.base_url + "/admin/config", timeout=60).json() == before


def test_schemathesis_finds_nothing_with_auth(
    servehall_server: Any, demo_model_dir: Path, tmp_path: Path
) -> None:
    pepper = tmp_path / "pepper"
    pepper.write_text(PEPPER + "\n")
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["auth"]},
        database={"url": f"sqlite+aiosqlite:///{tmp_path / 'st.db'}"},
        auth={"pepper": {"file": str(pepper)}},
    )
    from tests.conftest import dump_toml

    config = tmp_path / "auth.toml"
    config.write_text(dump_toml(cfg))
    up = run_cli(config, "db", "upgrade", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    made = run_cli(config, "keys", "create", "--tenant", "st", "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    with servehall_server(cfg, name="openapi-auth") as srv:
        doc = httpx.get(
            srv.base_url + "/openapi.json", headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        assert doc.status_code == 200
        spec = doc.json()
        assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert spec["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
        assert spec["paths"]["/health/live"]["get"]["security"] == []
        assert httpx.get(srv.base_url + "/openapi.json", timeout=60).status_code == 401
        assert_clean(
            run_schemathesis(srv.base_url, tmp_path, f"Authorization: Bearer {key}"),
            ADMIN_FORBIDDEN,
        )


# --- the document states the validator's rules -------------------------------------------


def test_document_states_what_the_validator_refuses(plain: ServerHandle) -> None:
    spec = httpx.get(plain.base_url + "/openapi.json", timeout=60).json()
    schemas = spec["components"]["schemas"]
    assert "content" in schemas["UserMessage"]["required"]
    assert "content" in schemas["SystemMessage"]["required"]
    assert "content" not in schemas["AssistantMessage"].get("required", [])
    stop = json.dumps(schemas["CompletionRequest"]["properties"]["stop"])
    assert '"minLength": 1' in stop
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["model"]["enum"] == ["demo"]
    # openvino_cpu refuses min_p: it is not offered; top_k and repetition_penalty are
    assert "min_p" not in chat and "top_k" in chat and "repetition_penalty" in chat
    n_max = [b.get("maximum") for b in chat["n"]["anyOf"] if b.get("type") == "integer"]
    assert n_max == [8]  # [server] max_n default

    url = plain.base_url + "/v1/chat/completions"
    no_content = {"model": "demo", "messages": [{"role": "user"}]}
    r = httpx.post(url, json=no_content, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    empty_stop = {"model": "demo", "messages": [{"role": "user", "content": "x"}], "stop": [""]}
    r = httpx.post(url, json=empty_stop, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def test_falsy_values_are_set(plain: ServerHandle) -> None:
    """N01: ``logprobs: 0`` asks for the sampled token's log-probability."""
    url = plain.base_url + "/v1/completions"
    base = {"model": "demo", "prompt": "Hello", "max_tokens": 4}
    r = httpx.post(url, json={**base, "logprobs": 0}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    assert r.json()["error"]["param"] == "logprobs"
    assert httpx.post(url, json={**base, "logprobs": None}, timeout=60).status_code == 200
    chat = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = httpx.post(
        plain.base_url + "/v1/chat/completions", json={**chat, "logprobs": False}, timeout=60
    )
    assert r.status_code == 200, r.text  # chat's boolean "off"
    r = httpx.post(
        plain.base_url + "/v1/chat/completions", json={**chat, "top_logprobs": 0}, timeout=60
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_sampling_extensions_honoured_or_refused(plain: ServerHandle) -> None:
    url = plain.base_url + "/v1/completions"
    # the first prompt the demo model loops on under greedy decoding (its drills: "red
    # green blue red green blue …"); which one depends on the trained weights
    base: dict[str, Any] = {}
    greedy, word = "", ""
    for prompt in (
        "red green blue red green blue",
        "Monday Tuesday Wednesday Thursday Friday Monday",
        "The weather today is",
        "ABCDEFGH ABCDEFGH ABC",
    ):
        base = {"model": "demo", "prompt": prompt, "max_tokens": 12}
        r = httpx.post(url, json={**base, "temperature": 0}, timeout=60)
        greedy = r.json()["choices"][0]["text"]
        word = max(greedy.split() or [""], key=greedy.split().count)
        if word and greedy.split().count(word) > 3:
            break
    assert greedy.split().count(word) > 3, greedy
    top1 = [
        httpx.post(url, json={**base, "temperature": 2, "seed": s, "top_k": 1}, timeout=60).json()
        for s in (1, 2)
    ]
    assert [t["choices"][0]["text"] for t in top1] == [greedy, greedy]
    rep = httpx.post(url, json={**base, "temperature": 0, "repetition_penalty": 5.0}, timeout=60)
    assert rep.status_code == 200
    assert rep.json()["choices"][0]["text"].split().count(word) < greedy.split().count(word)
    r = httpx.post(url, json={**base, "min_p": 0.1}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    assert r.json()["error"]["param"] == "min_p"
    # the neutral value asks for nothing, so it is not refused
    assert httpx.post(url, json={**base, "min_p": 0}, timeout=60).status_code == 200
