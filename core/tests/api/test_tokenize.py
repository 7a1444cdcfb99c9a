"""``/tokenize`` and ``/detokenize`` in process (Starlette app over httpx's ASGI
transport, the test tokenizer, a scripted engine that is never asked): request parsing,
the ids of each input path (they equal the inference routes'), errors, auth and the
OpenAPI document."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall import AuthenticationError, Policy, Principal, hookimpl
from servehall.api.app import create_app
from servehall.plugin.host import Host
from servehall.text.tokenizer import ChatTurn, load_tokenizer

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def bos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo tokenizer's recipe (byte-level BPE, a post-processor that prepends BOS)."""
    from text_fixtures import CORPUS

    from servehall.demo.tokenizer import DEMO_CHAT_TEMPLATE, train_tokenizer, write_tokenizer_files

    out = tmp_path_factory.mktemp("bos")
    tok = train_tokenizer(list(CORPUS))
    write_tokenizer_files(tok, out, chat_template=DEMO_CHAT_TEMPLATE, model_max_length=256)
    return out


def _client(host: Host) -> httpx.AsyncClient:
    app = create_app(host)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def _host(tok_dir: Path, **kw: Any) -> tuple[Host, ScriptedEngine]:
    engine = ScriptedEngine([5])
    return make_host(tok_dir, engine, **kw), engine


# --- the ids ---------------------------------------------------------------------------


async def test_prompt_ids_are_the_completion_paths(bos_dir: Path) -> None:
    host, engine = _host(bos_dir)
    tok = host.models["m"].tokenizer
    text = "Hello <|end|> world"  # a special token's text stays plain text
    async with _client(host) as c:
        r = await c.post("/tokenize", json={"model": "m", "prompt": text})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == tok.encode_plain(text, add_special_tokens=True)
        assert body["tokens"][0] == tok.hf.bos_token_id  # add_special_tokens defaults true
        assert body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 256
        assert body["token_strs"] is None
        assert "x-request-id" not in r.headers
        r = await c.post(
            "/tokenize",
            json={"prompt": text, "add_special_tokens": False, "return_token_strs": True},
        )
        body = r.json()
        assert body["tokens"] == tok.encode_plain(text)
        assert body["token_strs"] == tok.hf.convert_ids_to_tokens(body["tokens"])
        assert tok.hf.convert_tokens_to_string(body["token_strs"]) == text
        r = await c.post("/detokenize", json={"model": "m", "tokens": body["tokens"]})
        assert r.status_code == 200 and r.json() == {"prompt": text}
        # the completion route sends the model the same ids
        r = await c.post("/v1/completions", json={"model": "m", "prompt": text, "max_tokens": 1})
        assert r.status_code == 200
    assert engine.prompts[-1] == tok.encode_plain(text, add_special_tokens=True)
    assert host.records.records[-1].endpoint == "/v1/completions"
    assert len(host.records.records) == 1  # tokenize and detokenize are not recorded


async def test_chat_ids_are_the_chat_routes(tok_dir: Path) -> None:
    host, engine = _host(tok_dir)
    tok = host.models["m"].tokenizer
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    async with _client(host) as c:
        for extra in ({}, {"tools": [tool]}, {"tools": [tool], "tool_choice": "none"}):
            r = await c.post("/tokenize", json={"model": "m", "messages": MSGS, **extra})
            assert r.status_code == 200, r.text
            chat = {"model": "m", "messages": MSGS, "max_tokens": 1, **extra}
            assert (await c.post("/v1/chat/completions", json=chat)).status_code == 200
            assert r.json()["tokens"] == engine.prompts[-1], extra
        turns = [ChatTurn("system", "Be brief."), ChatTurn("user", "Hello world")]
        r = await c.post("/tokenize", json={"messages": MSGS, "add_generation_prompt": False})
        assert r.json()["tokens"] == tok.render_chat(turns, add_generation_prompt=False)
        assert r.json()["tokens"] != engine.prompts[-1]
        r = await c.post("/detokenize", json={"tokens": engine.prompts[-1]})
        text = r.json()["prompt"]
        assert text.startswith("<s><|turn|>system\nBe brief.<|end|>")  # specials written out
        assert text.endswith("<|turn|>assistant\n")


async def test_continue_final_message_and_template_kwargs(tok_dir: Path) -> None:
    host, _ = _host(tok_dir)
    prefill = [*MSGS, {"role": "assistant", "content": "The answer is"}]
    async with _client(host) as c:
        r = await c.post("/tokenize", json={"messages": prefill, "continue_final_message": True})
        assert r.status_code == 200, r.text
        r = await c.post("/detokenize", json={"tokens": r.json()["tokens"]})
        assert r.json()["prompt"].endswith("<|turn|>assistant\nThe answer is")
        r = await c.post(
            "/tokenize",
            json={"messages": MSGS, "chat_template_kwargs": {"bos_token": "<|turn|>"}},
        )
        assert r.status_code == 200
        assert r.json()["tokens"][0] == host.models["m"].tokenizer.hf.convert_tokens_to_ids(
            "<|turn|>"
        )


async def test_chat_add_special_tokens_adds_the_post_processors(bos_dir: Path) -> None:
    host, _ = _host(bos_dir)
    tok = load_tokenizer(bos_dir)
    async with _client(host) as c:
        plain = (await c.post("/tokenize", json={"messages": MSGS})).json()["tokens"]
        more = await c.post("/tokenize", json={"messages": MSGS, "add_special_tokens": True})
        assert more.json()["tokens"] == [tok.hf.bos_token_id, *plain]


# --- bad inputs ------------------------------------------------------------------------


BAD: list[tuple[str, dict[str, Any], str | None]] = [
    ("/tokenize", {"model": "m"}, "prompt"),
    ("/tokenize", {"model": "m", "prompt": "a", "messages": MSGS}, "prompt"),
    ("/tokenize", {"model": "m", "prompt": 5}, "prompt"),
    ("/tokenize", {"model": 5, "prompt": "a"}, "model"),
    ("/tokenize", {"model": "m", "prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"model": "m", "prompt": "a", "return_token_strs": 1}, "return_token_strs"),
    ("/tokenize", {"model": "m", "messages": []}, "messages"),
    ("/tokenize", {"model": "m", "messages": "hi"}, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    (
        "/tokenize",
        {"messages": MSGS, "continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
    ),
    (
        "/tokenize",
        {"messages": MSGS, "chat_template_kwargs": {"tools": []}},
        "chat_template_kwargs",
    ),
    ("/tokenize", {"messages": MSGS, "chat_template_kwargs": {"a b": 1}}, "chat_template_kwargs"),
    ("/tokenize", {"messages": MSGS, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ("/tokenize", {"messages": MSGS, "tool_choice": "required"}, "tool_choice"),
    ("/tokenize", {"messages": MSGS, "tools": [{"type": "function"}]}, "tools"),
    ("/detokenize", {"model": "m"}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
    ("/detokenize", {"tokens": [1, 2.5]}, "tokens"),
    ("/detokenize", {"tokens": [1, True]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [2**64]}, "tokens"),
    ("/detokenize", {"tokens": [1, 10**6]}, "tokens[1]"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
async def test_bad_inputs_are_400s_naming_the_field(
    tok_dir: Path, path: str, body: dict[str, Any], param: str | None
) -> None:
    host, _ = _host(tok_dir)
    async with _client(host) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert "Traceback" not in r.text
    assert host.records.records == []


async def test_template_refusal_and_unknown_models(tok_dir: Path) -> None:
    host, _ = _host(tok_dir)
    async with _client(host) as c:
        r = await c.post("/detokenize", json={"tokens": [1, 10**6]})
        assert r.json()["error"]["code"] == "invalid_token_id"
        for path, body in (
            ("/tokenize", {"model": "nope", "prompt": "a"}),
            ("/tokenize", {"model": "nope", "messages": MSGS}),
            ("/detokenize", {"model": "nope", "tokens": [1]}),
        ):
            r = await c.post(path, json=body)
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "model_not_found"
            assert r.json()["error"]["param"] == "model"
        for raw, ctype, status in (
            (b"{not json", "application/json", 400),
            (b"[1]", "application/json", 400),
            (b'{"prompt": "a"}', "text/plain", 415),
        ):
            r = await c.post("/tokenize", content=raw, headers={"content-type": ctype})
            assert r.status_code == status, r.text[:300]
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await c.get("/tokenize")
        assert r.status_code == 405
    small, _ = _host(tok_dir, settings={"server": {"max_body_bytes": 1024}})
    async with _client(small) as c:
        r = await c.post("/tokenize", json={"prompt": "a" * 2000})
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"]["type"] == "invalid_request_error"


# --- auth ------------------------------------------------------------------------------


class KeyAuth:
    """``Bearer good`` may use ``m``; ``Bearer other`` only ``x``; ``Bearer admin`` has no
    ``inference`` scope."""

    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        h = request.headers.get("authorization", "")
        if h == "Bearer good":
            return Principal(id="k1", policy=Policy(models=frozenset({"m"})))
        if h == "Bearer other":
            return Principal(id="k2", policy=Policy(models=frozenset({"x"})))
        if h == "Bearer admin":
            return Principal(id="k3", policy=Policy(scopes=frozenset({"admin"})))
        if h:
            raise AuthenticationError()
        return None


async def test_guarded_like_the_inference_routes(tok_dir: Path) -> None:
    host, _ = _host(tok_dir, plugins=[("keyauth", KeyAuth())])
    async with _client(host) as c:
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
            for auth in (None, "Bearer bad"):
                headers = {"authorization": auth} if auth else {}
                r = await c.post(path, json=body, headers=headers)
                assert r.status_code == 401, r.text
                assert r.headers["www-authenticate"] == "Bearer"
            good = {"authorization": "Bearer good"}
            assert (await c.post(path, json=body, headers=good)).status_code == 200
            other = {"authorization": "Bearer other"}
            r = await c.post(path, json=body, headers=other)  # the default model: none
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            r = await c.post(path, json={**body, "model": "m"}, headers=other)
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            r = await c.post(
                path, json={**body, "model": "m"}, headers={"authorization": "Bearer admin"}
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    # refused credentials are recorded by the auth middleware, as on every route
    assert [r.status_code for r in host.records.records] == [401] * 4


# --- the OpenAPI document ----------------------------------------------------------------


async def test_listed_in_the_openapi_document(tok_dir: Path) -> None:
    host, _ = _host(tok_dir, plugins=[("keyauth", KeyAuth())])
    async with _client(host) as c:
        doc = (await c.get("/openapi.json", headers={"authorization": "Bearer good"})).json()
    tok = host.models["m"].tokenizer
    for path in ("/tokenize", "/detokenize"):
        op = doc["paths"][path]["post"]
        assert op["security"] == [{"bearer": []}]
        assert {"200", "400", "401", "404"} <= set(op["responses"])
    schemas = doc["components"]["schemas"]
    body = doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["oneOf"] == [
        {"$ref": "#/components/schemas/TokenizeCompletionRequest"},
        {"$ref": "#/components/schemas/TokenizeChatRequest"},
    ]
    items = schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert items["maximum"] == tok.vocab_size - 1 and items["minimum"] == 0
    model = schemas["TokenizeChatRequest"]["properties"]["model"]
    assert {"type": "string", "enum": ["m"]} in model["anyOf"]
    assert set(schemas["TokenizeResponse"]["required"]) == {"count", "max_model_len", "tokens"}
