"""Versions on the request path in process: pin scope, response header, record, admin
route scope (a scripted engine; the real-server tests are tests/test_versions_e2e.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall import Policy, Principal, hookimpl
from servehall.api.app import create_app
from servehall.plugin.host import Host


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class Keys:
    """``Bearer user`` (inference only), ``Bearer tester`` (may pin), ``Bearer admin``."""

    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        scopes = {
            "Bearer user": {"inference"},
            "Bearer tester": {"inference", "model_version"},
            "Bearer admin": {"inference", "admin"},
        }.get(request.headers.get("authorization", ""))
        if scopes is None:
            return None
        return Principal(id="k-" + min(scopes), policy=Policy(scopes=frozenset(scopes)))


def _host(tok_dir: Path) -> Host:
    from servehall.text import load_tokenizer

    ids = load_tokenizer(tok_dir).encode_plain(" the quick brown fox")
    host = make_host(tok_dir, ScriptedEngine(ids), plugins=[("keys", Keys())])
    base = host.models.pop("m")
    for version, weight in (("a", 1.0), ("b", 0.0)):
        host.models[f"m@{version}"] = dataclasses.replace(base, version=version, weight=weight)
    return host


def _client(host: Host) -> httpx.AsyncClient:
    app = create_app(host)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


BODY = {"model": "m", "prompt": "hi", "max_tokens": 2}


async def test_pin_needs_the_scope_and_the_header_says_which_version(tok_dir: Path) -> None:
    host = _host(tok_dir)
    async with _client(host) as c:
        r = await c.post("/v1/completions", json=BODY, headers={"authorization": "Bearer user"})
        assert r.status_code == 200 and r.headers["x-servehall-model-version"] == "a"
        pin = {"x-servehall-model-version": "b"}
        r = await c.post(
            "/v1/completions", json=BODY, headers={"authorization": "Bearer user", **pin}
        )
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
        r = await c.post(
            "/v1/completions", json=BODY, headers={"authorization": "Bearer tester", **pin}
        )
        assert r.status_code == 200 and r.headers["x-servehall-model-version"] == "b"
        models = (await c.get("/v1/models", headers={"authorization": "Bearer user"})).json()
        assert [m["id"] for m in models["data"]] == ["m"]
    versions = [rec.version for rec in host.records.records]
    assert versions == ["a", None, "b"], versions


async def test_admin_config_route_needs_the_admin_scope(tok_dir: Path) -> None:
    host = _host(tok_dir)
    async with _client(host) as c:
        r = await c.get("/admin/config", headers={"authorization": "Bearer user"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
        r = await c.post(
            "/admin/config", json={"text": ""}, headers={"authorization": "Bearer tester"}
        )
        assert r.status_code == 403
        # an app built without live config (no serve): a clear 409, not a 500
        r = await c.get("/admin/config", headers={"authorization": "Bearer admin"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "config_live_off"
