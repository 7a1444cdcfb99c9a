"""servehall.engines.vllm.engine: the engine as built, before vLLM starts — without vLLM
in this environment a config error that says how to install it; under ``.venv-vllm`` (a
subprocess) ``model_info`` from the model directory, structured output offered only with
a tokenizer (vLLM compiles grammars with it), and the ``AsyncEngineArgs`` it would start
with. Serving is checked end to end in ``tests/test_vllm_e2e.py``; the embedding side in
``test_embedding.py``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.errors import ConfigError
from servehall.testing.vllm_env import run_in_vllm_env

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 1000,
    "max_position_embeddings": 128,
    "eos_token_id": [2, 7],
    "hidden_size": 64,
}

_SCRIPT = r"""
import json, sys
from pathlib import Path
from servehall.config.models import ModelConfig
from servehall.engines.vllm.engine import VllmEngine

out = {}
for path in sys.argv[1:]:
    mc = ModelConfig(name="m", path=Path(path), backend="cpu", options={"engine": "vllm"})
    e = VllmEngine(mc, "cpu", default_dtype="float32")
    info, args = e.model_info, e.engine_args()
    out[Path(path).name] = {
        "max_model_len": info.max_model_len, "eos": list(info.eos_token_ids),
        "vocab": info.vocab_size, "engine": info.extra["engine"], "dtype": info.extra["dtype"],
        "structured": "structured_output" in e.supported_params,
        "skip_tokenizer_init": args.skip_tokenizer_init, "args_dtype": args.dtype,
        "args_max_model_len": args.max_model_len, "served_name": args.served_model_name,
        "whitespace_bound": args.structured_outputs_config.disable_any_whitespace,
    }
json.dump(out, sys.stdout)
"""


def _model_dir(path: Path, *, tokenizer: bool) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def test_without_vllm_installed_the_model_is_a_config_error(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    from servehall.engines.vllm.engine import VllmEngine

    mc = ModelConfig(name="m", path=_model_dir(tmp_path / "m", tokenizer=False), backend="cpu")
    with pytest.raises(ConfigError) as err:
        VllmEngine(mc, "cpu")
    assert "models.m.options.engine" in str(err.value) and "pip install" in str(err.value)


def test_engine_as_built_under_vllm(tmp_path: Path) -> None:
    bare = _model_dir(tmp_path / "bare", tokenizer=False)
    tok = _model_dir(tmp_path / "tok", tokenizer=True)
    got = run_in_vllm_env(_SCRIPT, str(bare), str(tok))
    for name in ("bare", "tok"):
        g = got[name]
        assert (g["max_model_len"], g["eos"], g["vocab"]) == (128, [2, 7], 1000)
        assert (g["engine"], g["dtype"], g["args_dtype"]) == ("vllm", "float32", "float32")
        assert (g["args_max_model_len"], g["served_name"]) == (128, "m")
        assert g["whitespace_bound"] is True
    assert got["bare"]["structured"] is False and got["bare"]["skip_tokenizer_init"] is True
    assert got["tok"]["structured"] is True and got["tok"]["skip_tokenizer_init"] is False
