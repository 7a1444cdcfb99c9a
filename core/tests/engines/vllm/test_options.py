"""The vLLM engine's options, probe and selection — vLLM-free (they run in the main
environment, where vLLM is not installed; the engine itself is tested in
``tests/test_vllm_e2e.py`` and ``core/tests/engines/vllm/test_conformance.py`` under .venv-vllm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servehall import ConfigError
from servehall.config.models import ModelConfig
from servehall.engines.vllm import parse_vllm_options, vllm_build
from servehall.plugin.manager import PluginHost


def test_options_pass_to_engine_args() -> None:
    opts = parse_vllm_options(
        {
            "engine": "vllm",
            "dtype": "bf16",
            "gpu_memory_utilization": 0.85,
            "max_num_seqs": 32,
            "max_num_batched_tokens": 4096,
            "tensor_parallel_size": 4,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
            "enable_prefix_caching": False,
            "quantization": "awq",
            "kv_cache_space_gib": 1.5,
            "cpu_threads_bind": "0-1",
        },
        model="m",
    )
    assert opts.engine_args() == {
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.85,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 4096,
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
        "enable_prefix_caching": False,
        "quantization": "awq",
        "seed": 0,
    }
    assert opts.environment() == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}


def test_speculative_config_passes_through(tmp_path: Path) -> None:
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert (
        parse_vllm_options({"speculative_config": ngram}).engine_args()["speculative_config"]
        == ngram
    )
    draft = {"model": str(tmp_path), "num_speculative_tokens": 2}
    args = parse_vllm_options({"speculative_config": draft}).engine_args()
    assert args["speculative_config"] == draft
    assert "speculative_config" not in parse_vllm_options({}).engine_args()


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "positive integer"),
        ({"model": "/nonexistent/draft", "num_speculative_tokens": 2}, "not a directory"),
        ({"model": 3}, "draft model directory"),
        ("ngram", "dictionary"),
    ],
)
def test_speculative_config_errors_are_one_line(spec: Any, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_vllm_options({"speculative_config": spec}, model="m")
    ((key, msg),) = err.value.errors
    assert key == "models.m.options.speculative_config" and text in msg and "\n" not in msg


def test_defaults_leave_vllm_its_own() -> None:
    assert parse_vllm_options({}).engine_args() == {
        "dtype": "auto",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "seed": 0,
    }


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"dtype": "int3"}, "dtype"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"distributed_executor_backend": "slurm"}, "distributed_executor_backend"),
        ({"kv_cache_space_gib": -1}, "kv_cache_space_gib"),
        ({"swap_space": 4}, "swap_space"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_vllm_options(options, model="m")
    assert f"models.m.options.{key}" in str(info.value)


def test_batched_tokens_below_seqs_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens must be >= max_num_seqs"):
        parse_vllm_options({"max_num_seqs": 64, "max_num_batched_tokens": 16}, model="m")


def test_build_of_this_environment_is_named() -> None:
    build = vllm_build()  # the main environment: vLLM is not installed here
    assert build.describe() == ("vLLM not installed" if not build.installed else build.describe())
    assert "engine vllm: " in PluginHost([]).backends().probe("cpu").reason


def test_cpu_backend_offers_vllm_and_says_where_it_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    spec = PluginHost([]).backends().get("cpu")
    bad = ModelConfig(name="m", path=tmp_path, backend="cpu", options={"engine": "tpu"})
    with pytest.raises(ConfigError, match="choose from vllm, torch, onnxruntime"):
        spec.factory(bad)
    if vllm_build().installed:
        pytest.skip("vLLM is installed in this environment")
    model = ModelConfig(name="m", path=tmp_path, backend="cpu", options={"engine": "vllm"})
    with pytest.raises(ConfigError, match=r"models\.m\.options\.engine: vLLM is not installed"):
        spec.factory(model)


def test_vllm_engine_says_its_worker_defaults_under_the_configs_keys(tmp_path: Path) -> None:
    from servehall.config.worker import WorkerSettings

    spec = PluginHost([]).backends().get("cpu")

    def model(options: dict[str, Any], worker: dict[str, Any]) -> ModelConfig:
        return ModelConfig.model_validate(
            {"name": "m", "path": tmp_path, "backend": "cpu", "options": options, "worker": worker}
        )

    product = WorkerSettings().heartbeat_timeout_s
    # the vLLM engine's own default where the config leaves the key unset
    vllm = spec.worker_settings(model({"engine": "vllm"}, {"loop_timeout_s": 20.0}))
    assert (vllm.heartbeat_timeout_s, vllm.loop_timeout_s) == (10.0, 20.0)
    assert product < 10.0
    # a key the config sets wins, even when it equals the product default
    assert (
        spec.worker_settings(model({"engine": "vllm"}, {"heartbeat_timeout_s": product}))
    ).heartbeat_timeout_s == product
    # other engines keep the product defaults
    assert spec.worker_settings(model({"engine": "torch"}, {})).heartbeat_timeout_s == product
    assert spec.worker_settings(model({}, {})).heartbeat_timeout_s == product
    # a backend may say them itself; merged settings are validated
    own = replace(spec, worker_defaults=lambda mc: {"heartbeat_timeout_s": 0.05})
    with pytest.raises(ConfigError, match=r"models\.m\.worker: with the cpu engine's"):
        own.worker_settings(model({"engine": "vllm"}, {}))


def test_vllm_server_command_carries_the_options(tmp_path: Path) -> None:
    from servehall.bench.compare import parse_target
    from servehall.bench.vllm_server import vllm_server_command
    from servehall.config.worker import WorkerSettings

    mc = ModelConfig(
        name="small",
        path=tmp_path,
        backend="cpu",
        max_model_len=1024,
        options={
            "engine": "vllm",
            "max_num_seqs": 16,
            "enable_prefix_caching": False,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
        },
        worker=WorkerSettings(python=Path("/venv/bin/python")),
    )
    cmd = vllm_server_command(mc, "small", 8123)
    spec = cmd[cmd.index("--speculative-config") + 1]
    assert spec == '{"method": "ngram", "num_speculative_tokens": 3}'
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in (
        f"--model {tmp_path}",
        "--served-model-name small",
        "--port 8123",
        "--max-model-len 1024",
        "--dtype float32",  # the cpu backend's auto, as the engine makes it
        "--max-num-seqs 16",
        "--no-enable-prefix-caching",
    ):
        assert part in joined, (part, joined)
    assert parse_target("vllm-server:small").kind == "vllm-server"
