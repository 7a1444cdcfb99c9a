"""``servehall.api.admin_config``: ``GET``/``POST /admin/config`` on the real app with a
real :class:`~servehall.rollout.live.LiveConfig` (no revisions database; weights change
live, no engine starts): the admin scope, the running text, a live reweight, and each
bad body a 400 naming its problem (nothing changed)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from servehall import Policy, Principal, hookimpl
from servehall.api.admin_config import MAX_CONFIG_BYTES
from servehall.api.app import create_app
from servehall.config.settings import load_settings
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.rollout.live import LiveConfig


class Keys:
    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        scopes = {"Bearer admin": {"admin"}, "Bearer user": {"inference"}}.get(
            request.headers.get("authorization", "")
        )
        if scopes is None:
            return None
        return Principal(id="k-" + min(scopes), policy=Policy(scopes=frozenset(scopes)))


def _text(path: Path, a: float, b: float) -> str:
    out = ""
    for version, weight in (("a", a), ("b", b)):
        out += (
            f'[[models]]\nname = "m"\nversion = "{version}"\nweight = {weight:g}\n'
            f'path = "{path}"\nbackend = "null"\n\n'
        )
    return out


def _host(text: str) -> Host:
    settings = load_settings(data=tomllib.loads(text))
    host = Host(settings=settings, plugins=PluginHost([], extra=[("keys", Keys())]))
    for mc in settings.models:
        host.models[f"m@{mc.version}"] = ServedModel(
            name=mc.name,
            backend=mc.backend,
            engine=cast(Any, None),
            scheduler=cast(Any, None),
            tokenizer=None,
            max_model_len=64,
            version=mc.version,
            weight=mc.weight,
            config=mc,
        )
    return host


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Host, LiveConfig, httpx.AsyncClient]:
    text = _text(tmp_path, 1, 0)
    host = _host(text)
    live = LiveConfig(host, cast(Any, None), text, "toml", None)
    app = create_app(host, live=live)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return host, live, client


ADMIN = {"authorization": "Bearer admin"}


async def test_get_needs_admin_and_answers_the_running_text(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient],
) -> None:
    _, live, client = setup
    async with client as c:
        assert (await c.get("/admin/config")).status_code == 401
        r = await c.get("/admin/config", headers={"authorization": "Bearer user"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
        r = await c.get("/admin/config", headers=ADMIN)
    assert r.status_code == 200
    body = r.json()
    assert body["format"] == "toml" and body["text"] == live.text
    assert body["hash"] == live.hash and "revision" in body


async def test_post_reweights_live(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient], tmp_path: Path
) -> None:
    host, _, client = setup
    async with client as c:
        r = await c.post("/admin/config", headers=ADMIN, json={"text": _text(tmp_path, 0.5, 0.5)})
    assert r.status_code == 200, r.text
    assert sorted(r.json()["reweighted"]) == ["m@a", "m@b"]
    assert host.models["m@a"].weight == 0.5 and host.models["m@b"].weight == 0.5


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"not json", "config_invalid", None),
        (b'["text"]', None, "text"),
        (b'{"text": 3}', None, "text"),
        (b'{"text": "", "format": "ini"}', None, "format"),
        (b'{"text": "[[models]]\\nname = 3\\n"}', "config_invalid", None),
    ],
)
async def test_bad_bodies_are_400s_and_change_nothing(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient],
    body: bytes,
    code: str | None,
    param: str | None,
) -> None:
    host, _, client = setup
    async with client as c:
        r = await c.post("/admin/config", headers=ADMIN, content=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert host.models["m@a"].weight == 1 and host.models["m@b"].weight == 0


CHUNK = 64 * 1024


@pytest.mark.parametrize("declared", [False, True])
async def test_a_body_over_the_limit_is_a_413_refused_while_reading(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient], declared: bool
) -> None:
    """Over :data:`MAX_CONFIG_BYTES`: a streamed (chunked) body is refused once the bytes
    read pass the limit, the rest never read; a declared ``Content-Length`` over it before
    any is read. 413 ``payload_too_large`` in the OpenAI envelope, nothing changed."""
    host, _, client = setup
    total = 8 * MAX_CONFIG_BYTES // CHUNK  # chunks on offer: 8 MiB
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for i in range(total):
            sent += 1
            head = b'{"text": "' if i == 0 else b""
            yield head + b"#" * (CHUNK - len(head))  # CHUNK bytes each

    headers = {**ADMIN, "content-length": str(total * CHUNK)} if declared else ADMIN
    async with client as c:
        r = await c.post("/admin/config", headers=headers, content=body())
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "payload_too_large"
    assert str(MAX_CONFIG_BYTES) in err["message"]
    # read up to the limit (16 chunks) and the one chunk that passes it, no further
    assert sent == (0 if declared else MAX_CONFIG_BYTES // CHUNK + 1)
    assert host.models["m@a"].weight == 1 and host.models["m@b"].weight == 0


async def test_a_body_at_the_limit_is_read(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient], tmp_path: Path
) -> None:
    """Exactly :data:`MAX_CONFIG_BYTES` bytes (the config padded with a comment) is
    read and applied."""
    host, _, client = setup
    head = json.dumps({"text": _text(tmp_path, 0.5, 0.5) + "#"})[:-2]
    raw = (head + "#" * (MAX_CONFIG_BYTES - len(head) - 2) + '"}').encode()
    assert len(raw) == MAX_CONFIG_BYTES
    async with client as c:
        r = await c.post("/admin/config", headers=ADMIN, content=raw)
    assert r.status_code == 200, r.text
    assert host.models["m@a"].weight == 0.5


@pytest.mark.parametrize(
    "body",
    [
        {"text": '{"type": "string"}}\n</tools>'},  # tomlkit: empty key
        {"text": "= 1"},
        {"text": "a: [1\n- b", "format": "yaml"},
        {"text": 'x = "\ud800"'},  # a lone surrogate has no UTF-8 form
        {"text": "x: \ud800", "format": "yaml"},
    ],
)
async def test_unparsable_texts_are_400s(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient], body: dict[str, str]
) -> None:
    """Found by schemathesis: a text that does not parse was a 500 (the canary-rollback
    step edited it before it was parsed), and so was one with a lone surrogate."""
    host, _, client = setup
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate as a \ud800 escape
    async with client as c:
        r = await c.post("/admin/config", headers=ADMIN, content=raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "config_invalid"
    assert host.models["m@a"].weight == 1 and host.models["m@b"].weight == 0


async def test_an_invalid_config_lists_its_errors(
    setup: tuple[Host, LiveConfig, httpx.AsyncClient], tmp_path: Path
) -> None:
    _, _, client = setup
    text = _text(tmp_path, 1, 0) + '[scheduler]\npolicy = "wfq"\nmax_queue = -1\n'
    async with client as c:
        r = await c.post("/admin/config", headers=ADMIN, json={"text": text})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "scheduler.max_queue" in message and "scheduler.policy" in message
