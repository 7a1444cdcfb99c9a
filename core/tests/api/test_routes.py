"""``servehall.api.routes`` on the real app (a scripted engine and the test tokenizer):
health, the model list and retrieval filtered by the caller's allow-list (404 alike for
a hidden and an unknown model), Prometheus metrics, and the OpenAPI document built once
from the served models."""

from __future__ import annotations

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
from servehall.metrics import CONTENT_TYPE, Metrics
from servehall.plugin.host import Host
from servehall.serving.probe import Readiness


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class OnlyX:
    """``Bearer x`` may use model ``x`` only; ``Bearer all`` every model."""

    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        h = request.headers.get("authorization", "")
        if h == "Bearer x":
            return Principal(id="kx", policy=Policy(models=frozenset({"x"})))
        if h == "Bearer all":
            return Principal(id="ka")
        return None


def _client(host: Host, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(host, **kw)), base_url="http://t"
    )


async def test_health_live_and_ready(tok_dir: Path) -> None:
    host = make_host(tok_dir, ScriptedEngine([5]))
    readiness = Readiness(host)
    async with _client(host, readiness=readiness) as c:
        assert (await c.get("/health/live")).json() == {"status": "ok"}
        r = await c.get("/health/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["status"] == "not_ready"
        readiness.mark_ok("m")
        r = await c.get("/health/ready")
        assert r.status_code == 200 and "retry-after" not in r.headers
        assert r.json()["models"]["m"]["ready"] is True


async def test_models_follow_the_allow_list(tok_dir: Path) -> None:
    host = make_host(tok_dir, ScriptedEngine([5]), plugins=[("auth", OnlyX())])
    async with _client(host) as c:
        everyone = await c.get("/v1/models", headers={"authorization": "Bearer all"})
        body = everyone.json()
        assert body["object"] == "list"
        assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [
            ("m", "model", 256)
        ]
        one = await c.get("/v1/models/m", headers={"authorization": "Bearer all"})
        assert one.status_code == 200 and one.json()["id"] == "m"
        hidden = await c.get("/v1/models", headers={"authorization": "Bearer x"})
        assert hidden.json()["data"] == []
        for name in ("m", "nope"):
            r = await c.get(f"/v1/models/{name}", headers={"authorization": "Bearer x"})
            assert r.status_code == 404
            err = r.json()["error"]
            assert err["code"] == "model_not_found" and err["param"] == "model"
            assert f"`{name}`" in err["message"]


async def test_metrics_exposition(tok_dir: Path) -> None:
    host = make_host(tok_dir, ScriptedEngine([5]))
    metrics = Metrics()
    async with _client(host, metrics=metrics) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
    assert "# TYPE" in r.text


async def test_openapi_describes_the_served_models_once(tok_dir: Path) -> None:
    host = make_host(tok_dir, ScriptedEngine([5], supported=("seed",)))
    app = create_app(host)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        doc = (await c.get("/openapi.json")).json()
        schemas = doc["components"]["schemas"]
        assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == ["m"]
        assert "top_p" not in schemas["ChatCompletionRequest"]["properties"]  # not supported
        vocab = host.models["m"].tokenizer.vocab_size
        assert schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == vocab - 1
        assert app.state.openapi is not None
        host.models.clear()  # built once: later changes do not rebuild it
        again = (await c.get("/openapi.json")).json()
    assert again == doc
