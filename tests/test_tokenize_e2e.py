"""``/tokenize`` and ``/detokenize`` against a real ``servehall serve`` (Hypercorn, HTTP/2
over httpx, the demo model): 100 random Unicode strings — CJK, emoji sequences,
combining marks, right-to-left scripts, control characters, special-token look-alikes —
round-trip exactly (the demo tokenizer is byte-level BPE with no normalizer, so every
string can); the chat path counts what chat completions report as ``prompt_tokens``;
bad inputs are 400 envelopes naming the field; both routes are in ``/openapi.json``.
(Credentials: ``tests/test_auth_e2e.py``'s route table covers every route; the
in-process tests in ``core/tests/api/test_tokenize.py`` check scopes and allow-lists.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerHandle, demo_config

SEED = 20261203

#: Pieces the random strings are drawn from, by kind.
POOLS: dict[str, list[str]] = {
    "cjk": [chr(c) for c in range(0x4E00, 0x4E00 + 400, 7)]
    + list("日本語のテキストです한국어텍스트繁體中文")
    + [chr(0x20000), chr(0x2A6D6)],  # CJK extension B (4-byte UTF-8)
    "emoji": [
        "😀",
        "🎉",
        "👍🏽",  # skin tone modifier
        "👨\u200d👩\u200d👧\u200d👦",  # ZWJ family
        "🏳️\u200d🌈",  # flag with variation selector and ZWJ
        "🇫🇷",  # regional indicators
        "❤️",
        "1️⃣",  # keycap
        "🫠",
    ],
    "combining": [
        "e\u0301",  # é decomposed (no normalizer may compose it)
        "a\u0308\u0304",
        "Z\u0351\u0358\u0367\u0300\u036b",  # zalgo
        "\u0915\u094d\u0937",  # Devanagari conjunct
        "\u0e01\u0e33",  # Thai
        "n\u0303",
        "\u05e9\u05c1\u05b8",  # Hebrew with points
    ],
    "scripts": list("Ωλπ мир عربى שלום ελληνικά"),
    "ascii": list("abcdefghijklmnopqrstuvwxyz ABC 0123456789 .,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`"),
    "space": [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u200b", "\u2028", "\ufeff"],
    "control": ["\x00", "\x01", "\x1b", "\x7f", "\u0085"],
    "lookalike": ["<|user|>", "<|end|>", "<|begin_of_text|>", "<|assistant|>", "<s>"],
    "other": ["\ufffd", "\U0001d49c", "\u202e", "\U000e0041", "\uf8ff", "\U0010fffd"],
}


def random_strings(n: int, seed: int) -> list[str]:
    """``n`` strings of 1–40 pieces each; every string holds CJK, an emoji and a
    combining sequence, the rest is drawn from every pool."""
    rng = random.Random(seed)
    kinds = list(POOLS)
    out = []
    for _ in range(n):
        parts = [
            rng.choice(POOLS["cjk"]),
            rng.choice(POOLS["emoji"]),
            rng.choice(POOLS["combining"]),
        ]
        parts += [rng.choice(POOLS[rng.choice(kinds)]) for _ in range(rng.randint(0, 37))]
        rng.shuffle(parts)
        out.append("".join(parts))
    return out


@pytest.fixture(scope="module")
def server(servehall_server: Any, demo_model_dir: Path) -> Iterator[ServerHandle]:
    with servehall_server(demo_config(demo_model_dir), name="tokenize") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, http1=False, http2=True, timeout=60) as c:
        yield c


def test_random_unicode_round_trips(client: httpx.Client) -> None:
    strings = random_strings(100, SEED)
    assert len(set(strings)) == 100
    for s in strings:
        r = client.post(
            "/tokenize", json={"model": "demo", "prompt": s, "add_special_tokens": False}
        )
        assert r.status_code == 200, r.text
        assert r.http_version == "HTTP/2"
        body = r.json()
        assert body["count"] == len(body["tokens"]) > 0
        back = client.post("/detokenize", json={"model": "demo", "tokens": body["tokens"]})
        assert back.status_code == 200, back.text
        assert back.json()["prompt"] == s, (s, body["tokens"])
        # with the tokenizer's own BOS, written out on the way back (vLLM's decode)
        r = client.post("/tokenize", json={"prompt": s})
        assert r.json()["tokens"][1:] == body["tokens"]
        back = client.post("/detokenize", json={"tokens": r.json()["tokens"]})
        assert back.json()["prompt"] == "<|begin_of_text|>" + s


def test_token_strs_spell_the_ids(client: httpx.Client) -> None:
    r = client.post(
        "/tokenize",
        json={"model": "demo", "prompt": "Hello 中文 😀", "return_token_strs": True},
    )
    body = r.json()
    assert len(body["token_strs"]) == body["count"]
    assert body["token_strs"][0] == "<|begin_of_text|>"
    assert body["max_model_len"] > 0


def test_chat_counts_what_chat_completions_report(client: httpx.Client) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "system", "content": "Be brief. 简短 🙂"},
        {"role": "user", "content": "Weather in Paris? e\u0301 <|end|>"},
    ]
    for extra in ({}, {"tools": [tool]}):
        r = client.post("/tokenize", json={"model": "demo", "messages": messages, **extra})
        assert r.status_code == 200, r.text
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "demo", "messages": messages, "max_tokens": 1, **extra},
        )
        assert chat.status_code == 200, chat.text
        assert r.json()["count"] == chat.json()["usage"]["prompt_tokens"], extra
    text = client.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
    assert "Weather in Paris? e\u0301 <|end|>" in text  # the look-alike stays text


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "demo"}, 400, "prompt"),
        ("/tokenize", {"model": "demo", "prompt": ["a"]}, 400, "prompt"),
        (
            "/tokenize",
            {"model": "demo", "prompt": "a", "add_special_tokens": 1},
            400,
            "add_special_tokens",
        ),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/detokenize", {"model": "demo", "tokens": [1, "x"]}, 400, "tokens"),
        ("/detokenize", {"model": "demo", "tokens": [5, 10**9]}, 400, "tokens[1]"),
        ("/detokenize", {"model": "nope", "tokens": [5]}, 404, "model"),
    ],
)
def test_bad_inputs(
    client: httpx.Client, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["param"] == param


def test_listed_in_openapi(client: httpx.Client, server: ServerHandle) -> None:
    doc = client.get("/openapi.json").json()
    assert {"/tokenize", "/detokenize"} <= set(doc["paths"])
    vocab = client.post("/tokenize", json={"prompt": "x", "return_token_strs": True})
    assert vocab.status_code == 200
    items = doc["components"]["schemas"]["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert client.post("/detokenize", json={"tokens": [items["maximum"]]}).status_code == 200
    r = client.post("/detokenize", json={"tokens": [items["maximum"] + 1]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_token_id"
    assert "Traceback" not in server.log_text()
