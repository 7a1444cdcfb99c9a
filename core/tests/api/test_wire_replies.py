"""``servehall.api.wire_replies``: the models state what the endpoints really write —
real answers of the app (a scripted engine and the test tokenizer) validate against
them and carry no field the models leave out (so the OpenAPI document built from them
describes every field a client receives)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.api import wire_replies as out
from servehall.api.app import create_app


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _undeclared(model: type[BaseModel], data: Any, where: str = "") -> list[str]:
    """Keys of ``data`` that ``model`` (recursively) does not declare."""
    found: list[str] = []
    obj = model.model_validate(data)
    for key, value in data.items():
        if key not in type(obj).model_fields:
            found.append(f"{where}{key}")
            continue
        sub = getattr(obj, key)
        if isinstance(sub, BaseModel) and isinstance(value, dict):
            found += _undeclared(type(sub), value, f"{where}{key}.")
        elif isinstance(sub, list) and isinstance(value, list):
            for i, (s, v) in enumerate(zip(sub, value, strict=True)):
                if isinstance(s, BaseModel) and isinstance(v, dict):
                    found += _undeclared(type(s), v, f"{where}{key}[{i}].")
    return found


@pytest.fixture
async def client(tok_dir: Path) -> Any:
    from servehall.text import load_tokenizer

    tok = load_tokenizer(tok_dir)
    host = make_host(tok_dir, ScriptedEngine(tok.encode_plain(" the quick brown fox")))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(host)), base_url="http://t"
    ) as c:
        yield c


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_chat_completion(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert _undeclared(out.ChatCompletion, body) == []


async def test_chat_chunks(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = [
        json.loads(line[6:])
        for line in r.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert len(chunks) >= 3
    for chunk in chunks:
        assert _undeclared(out.ChatCompletionChunk, chunk) == [], chunk
    assert out.ChatCompletionChunk.model_validate(chunks[-1]).usage is not None


async def test_completion(client: httpx.AsyncClient) -> None:
    body = (
        await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
    ).json()
    assert _undeclared(out.Completion, body) == []


async def test_models_and_errors(client: httpx.AsyncClient) -> None:
    assert _undeclared(out.ModelList, (await client.get("/v1/models")).json()) == []
    assert _undeclared(out.ModelCard, (await client.get("/v1/models/m")).json()) == []
    err = (await client.post("/v1/chat/completions", json={**CHAT, "temperature": "hot"})).json()
    assert _undeclared(out.ErrorResponse, err) == []
    missing = (await client.get("/v1/models/none")).json()
    assert _undeclared(out.ErrorResponse, missing) == []


async def test_tokenize_and_detokenize(client: httpx.AsyncClient) -> None:
    tok = (
        await client.post(
            "/tokenize", json={"model": "m", "prompt": "hi", "return_token_strs": True}
        )
    ).json()
    assert _undeclared(out.TokenizeResponse, tok) == []
    detok = (await client.post("/detokenize", json={"model": "m", "tokens": tok["tokens"]})).json()
    assert _undeclared(out.DetokenizeResponse, detok) == []


def test_an_undeclared_field_is_found() -> None:
    data = {
        "id": "x",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1, "extra": 1},
    }
    assert _undeclared(out.ChatCompletion, data) == ["usage.extra"]
