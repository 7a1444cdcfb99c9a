"""openvino_cpu: probe (import-light, honest reasons), registration, option validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servehall import BackendRegistry, ConfigError, ModelConfig
from servehall_openvino_cpu import plugin
from servehall_openvino_cpu import probe as probe_mod
from servehall_openvino_cpu.options import (
    OpenVINOOptions,
    kv_block_bytes,
    parse_options,
    plan_num_kv_blocks,
)


def test_probe_available_here_with_reason() -> None:
    result = probe_mod.probe()
    assert result.available, result.reason
    assert "OpenVINO GenAI" in result.reason and "x86-64" in result.reason


def test_probe_and_plugin_import_do_not_load_openvino() -> None:
    code = (
        "import sys, json; import servehall_openvino_cpu.plugin as p; r = p.probe(); "
        "print(json.dumps([r.available, sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('openvino', 'openvino_genai', 'torch', 'optimum'))]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    available, heavy = json.loads(out.stdout)
    assert available is True
    assert heavy == []


def test_probe_reports_wrong_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod.platform, "machine", lambda: "aarch64")
    result = probe_mod.probe()
    assert not result.available and "aarch64" in result.reason


def test_probe_reports_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = probe_mod.importlib.util.find_spec
    monkeypatch.setattr(
        probe_mod.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "openvino_genai" else real(name, *a),
    )
    result = probe_mod.probe()
    assert not result.available
    assert "openvino_genai not installed" in result.reason and "pip install" in result.reason


def test_probe_says_when_only_ir_directories_can_be_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "optimum-intel" not in probe_mod.probe().reason  # installed here
    monkeypatch.setattr(probe_mod, "exporter_installed", lambda: False)
    result = probe_mod.probe()
    assert result.available  # IR directories need no exporter
    assert "IR directories only" in result.reason and "optimum-intel" in result.reason


def test_probe_reports_missing_sse42(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "cpu_flags", lambda: frozenset({"fpu", "sse2"}))
    result = probe_mod.probe()
    assert not result.available and "SSE4.2" in result.reason


def test_registers_backend_with_auto_priority() -> None:
    reg = BackendRegistry()
    plugin.servehall_register_backends(reg)
    spec = reg.get("openvino_cpu")
    assert spec.auto_priority == 50
    assert reg.select("openvino_cpu") is spec
    (row,) = reg.describe()
    assert row["available"] is True and row["reason"]


def test_options_defaults_and_properties() -> None:
    o = OpenVINOOptions()
    assert o.inference_precision == "f32"
    assert o.ov_properties() == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    bf = OpenVINOOptions(inference_precision="bf16", inference_num_threads=2)
    assert bf.ov_properties() == {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2}
    assert OpenVINOOptions(kv_cache_precision="u8").kv_precision() == "u8"


def test_options_accept_torch_spellings() -> None:
    assert parse_options({"dtype": "float32"}, model="m").inference_precision == "f32"
    assert (
        parse_options({"inference_precision": "bfloat16"}, model="m").inference_precision == "bf16"
    )
    assert parse_options({"dtype": "auto"}, model="m").inference_precision == "f32"
    with pytest.raises(ConfigError, match="contradicts"):
        parse_options({"dtype": "bf16", "inference_precision": "f32"}, model="m")


def test_options_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        parse_options({"inference_precision": "f64", "bogus": 1}, model="m")
    keys = {k for k, _ in err.value.errors}
    assert keys == {"models.m.options.inference_precision", "models.m.options.bogus"}
    with pytest.raises(ConfigError, match="not both"):
        parse_options({"kv_cache_size_gb": 1, "num_kv_blocks": 10}, model="m")
    with pytest.raises(ConfigError, match="num_kv_blocks"):
        parse_options({"num_kv_blocks": 0}, model="m")


def test_kv_pool_planning() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 128,
    }
    # 2 (K,V) x 4 layers x 2 heads x 32 dims x 32 tokens x 4 bytes
    assert kv_block_bytes(cfg, "f32") == 65536
    assert kv_block_bytes(cfg, "bf16") == 32768
    assert plan_num_kv_blocks(OpenVINOOptions(num_kv_blocks=7), cfg, 2048) == 7
    assert plan_num_kv_blocks(OpenVINOOptions(kv_cache_size_gb=1), cfg, 2048) == 16384
    # default: max_num_seqs full-length sequences
    assert plan_num_kv_blocks(OpenVINOOptions(max_num_seqs=3), cfg, 100) == 3 * 4


def test_factory_rejects_bad_options_and_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        plugin.factory(ModelConfig(name="x", path=tmp_path / "missing", backend="openvino_cpu"))
    with pytest.raises(ConfigError, match=r"models\.x\.options\.max_num_seqs"):
        plugin.factory(
            ModelConfig(
                name="x", path=tmp_path, backend="openvino_cpu", options={"max_num_seqs": 0}
            )
        )
    monkeypatch.setattr(probe_mod, "bf16_native", lambda: False)
    with pytest.raises(ConfigError, match="bf16"):
        plugin.factory(
            ModelConfig(
                name="x",
                path=tmp_path,
                backend="openvino_cpu",
                options={"inference_precision": "bf16"},
            )
        )
