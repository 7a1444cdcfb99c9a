"""Tests of servehall.bench.soak.mix: every valid shape passes the API's own request
models (so the soak's "valid" traffic is valid), the shapes cover what the docstrings
list, disconnect shapes stream, and draws follow the category weights and skip empty
categories. (Determinism and category presence: test_invariants.py.)"""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import BaseModel

from servehall.api.responses_wire import ResponsesRequest
from servehall.api.wire import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from servehall.bench.soak.corpus import (
    CHAT,
    COMPLETIONS,
    DETOKENIZE,
    EMBEDDINGS,
    RESPONSES,
    TOKENIZE,
)
from servehall.bench.soak.mix import (
    WEIGHTS,
    Mix,
    disconnect_shapes,
    embedding_shapes,
    tokenizer_shapes,
    valid_shapes,
)


def test_valid_shapes_pass_the_api_request_models() -> None:
    shapes = valid_shapes("m", 5)
    assert len({s.name for s in shapes}) == len(shapes)
    models: dict[str, type[BaseModel]] = {
        CHAT: ChatCompletionRequest,
        COMPLETIONS: CompletionRequest,
        RESPONSES: ResponsesRequest,
    }
    for s in shapes:
        assert s.body is not None and s.body["model"] == "m", s.name
        models[s.path].model_validate(s.body)  # raises on an invalid body
    for s in tokenizer_shapes("m"):
        assert s.body is not None
        if s.path == DETOKENIZE:
            DetokenizeRequest.model_validate(s.body)
        elif "messages" in s.body:
            TokenizeChatRequest.model_validate(s.body)
        else:
            assert s.path == TOKENIZE
            TokenizeCompletionRequest.model_validate(s.body)


def test_valid_shapes_cover_the_documented_variants() -> None:
    by_name = {s.name: s for s in valid_shapes("m", 5)}
    bodies = [s.body or {} for s in by_name.values()]
    choices = {str(b.get("tool_choice")) for b in bodies if "tools" in b and b.get("messages")}
    assert {"auto", "none", "required", "None"} <= choices
    assert any(isinstance(b.get("tool_choice"), dict) for b in bodies)
    formats = {(b.get("response_format") or {}).get("type") for b in bodies}
    assert {"json_object", "json_schema", "text"} <= formats
    assert {"guided_regex", "guided_choice", "guided_json", "structured_outputs"} <= {
        k for b in bodies for k in b
    }
    streamed = [s for s in by_name.values() if s.stream]
    assert {s.path for s in streamed} == {CHAT, COMPLETIONS, RESPONSES}
    assert by_name["chat"].body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me"},
        ],
        "max_tokens": 5,
    }
    assert by_name["chat_max_completion_tokens"].body["max_completion_tokens"] == 3  # type: ignore[index]
    assert by_name["responses"].body["max_output_tokens"] == 5  # type: ignore[index]
    assert {s.body.get("model") for s in tokenizer_shapes("m") if s.body} == {"m", None}


def test_disconnect_shapes_stream_and_leave() -> None:
    shapes = disconnect_shapes("m")
    assert shapes and all(s.disconnect and s.stream for s in shapes)
    assert all((s.body or {}).get("max_tokens") == 64 for s in shapes)


def test_draws_follow_the_weights_and_skip_empty_categories() -> None:
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    mix = Mix("m", seed=7, schemas=1, embed_model="e")
    drawn = Counter(cat for cat, _ in (mix.draw() for _ in range(4000)))
    for cat, weight in WEIGHTS.items():
        assert drawn[cat] / 4000 == pytest.approx(weight, abs=0.03), cat
    mix.categories["hostile"] = []
    mix.categories["sdk"] = []
    cats = {cat for cat, _ in (mix.draw() for _ in range(500))}
    assert cats == set(WEIGHTS) - {"hostile", "sdk"}
    # each draw is one of that category's shapes
    cat, shape = mix.draw()
    assert shape in mix.categories[cat]


def test_embedding_shapes_pass_the_wire_model_and_name_the_embedding_model() -> None:
    shapes = embedding_shapes("e")
    assert len({s.name for s in shapes}) == len(shapes)
    for s in shapes:
        assert s.path == EMBEDDINGS and s.body is not None and s.body["model"] == "e"
        # the refused ones are refused by the served model (its dimensions, length,
        # vocabulary), not by the wire: they reach the handler
        EmbeddingRequest.model_validate(s.body)
    inputs = [s.body["input"] for s in shapes if s.body]
    assert any(isinstance(i, str) for i in inputs)
    assert any(isinstance(i, list) and i and isinstance(i[0], list) for i in inputs)
    assert any(isinstance(i, list) and i and isinstance(i[0], int) for i in inputs)
    assert {(s.body or {}).get("encoding_format") for s in shapes} >= {"base64", "float"}


def test_no_embedding_model_no_embedding_traffic() -> None:
    mix = Mix("m", seed=3, schemas=1)
    assert mix.categories["embeddings"] == []
    assert all(cat != "embeddings" for cat, _ in (mix.draw() for _ in range(2000)))
    with_embed = Mix("m", seed=3, schemas=1, embed_model="e")
    drawn = [
        shape for cat, shape in (with_embed.draw() for _ in range(2000)) if cat == "embeddings"
    ]
    assert drawn and all(s.body and s.body["model"] == "e" for s in drawn)
