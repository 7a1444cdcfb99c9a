"""``/v1/embeddings`` pieces without a server (issue 34 item 3): the request model, the
input forms, ``dimensions``, base64 encoding and the task check. Pooling is tested in
``engines/test_pooling.py``, the embed messages in ``worker/test_messages.py``, the torch
embedding engine in ``engines/torch/test_embedding.py``."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from servehall.api.embeddings import as_inputs, check_dimensions, check_length, encode_vector
from servehall.api.wire import MAX_EMBEDDING_INPUTS, EmbeddingRequest
from servehall.config.models import ModelConfig
from servehall.engines.contract import EmbeddingEngine, check_embedding_engine
from servehall.engines.null import NullEngine
from servehall.errors import ConfigError, ContextLengthExceededError, InvalidRequestError

# --- the request ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["hello", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [1.0, 2.0]],
)
def test_input_forms_validate(value: Any) -> None:
    req = EmbeddingRequest.model_validate({"model": "m", "input": value})
    assert req.encoding_format == "float" and req.dimensions is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": 5}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [[1], []]}, "input"),
        ({"input": [1, -2]}, "input"),
        ({"input": [True]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
        ({"input": "a", "dimensions": 1.5}, "dimensions"),
        ({}, "input"),
        ({"input": "a", "model": 3}, "model"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        EmbeddingRequest.model_validate({"model": "m", **body})
    assert {e["loc"][0] for e in exc.value.errors()} == {field}


def test_as_inputs() -> None:
    assert as_inputs("hi") == (["hi"], None)
    assert as_inputs(["a", "b"]) == (["a", "b"], None)
    assert as_inputs([5, 6]) == (None, [[5, 6]])
    assert as_inputs([[5], [6, 7]]) == (None, [[5], [6, 7]])
    for bad, param in (([], "input"), ("", "input"), (["a", ""], "input[1]")):
        with pytest.raises(InvalidRequestError) as exc:
            as_inputs(bad)
        assert exc.value.param == param
    with pytest.raises(InvalidRequestError, match=str(MAX_EMBEDDING_INPUTS)):
        as_inputs(["a"] * (MAX_EMBEDDING_INPUTS + 1))


def test_check_length_names_the_limit() -> None:
    check_length([1] * 8, 8, "input")
    with pytest.raises(ContextLengthExceededError, match="maximum input length is 8") as exc:
        check_length([1] * 9, 8, "input[2]")
    assert exc.value.param == "input[2]" and exc.value.status == 400


def test_dimensions() -> None:
    plain = {"embedding_dim": 384, "matryoshka": False}
    assert check_dimensions(None, plain) is None
    assert check_dimensions(384, plain) is None  # its own size: nothing to do
    with pytest.raises(InvalidRequestError, match="Matryoshka") as exc:
        check_dimensions(128, plain)
    assert exc.value.param == "dimensions"
    any_dim = {"embedding_dim": 768, "matryoshka": True, "matryoshka_dimensions": []}
    assert check_dimensions(100, any_dim) == 100
    listed = {**any_dim, "matryoshka_dimensions": [256, 512]}
    assert check_dimensions(256, listed) == 256
    for bad, extra in ((300, listed), (1024, any_dim)):
        with pytest.raises(InvalidRequestError) as exc:
            check_dimensions(bad, extra)
        assert exc.value.param == "dimensions"


def test_base64_is_little_endian_float32() -> None:
    v = [0.5, -1.25, 3.0e-8, 1.0]
    assert encode_vector(v, "float") == v
    text = encode_vector(v, "base64")
    assert isinstance(text, str)
    raw = base64.b64decode(text)
    assert len(raw) == 16 and raw[:4] == b"\x00\x00\x00\x3f"  # 0.5, little-endian
    assert np.allclose(np.frombuffer(raw, dtype="<f4"), v)


# --- the engine contract and config ----------------------------------------------------


def test_task_needs_an_engine_that_embeds(tmp_path: Path) -> None:
    assert ModelConfig(name="m", path=tmp_path).task == "generate"
    with pytest.raises(ValidationError):
        ModelConfig(name="m", path=tmp_path, task="classify")  # type: ignore[arg-type]
    engine = NullEngine(ModelConfig(name="m", path=tmp_path, backend="null"))
    assert not isinstance(engine, EmbeddingEngine)
    check_embedding_engine("m", "generate", engine)
    with pytest.raises(ConfigError, match=r"models\.m\.task"):
        check_embedding_engine("m", "embed", engine)
