"""openvino_cpu: int8/int4 weight formats (NNCF weight compression at conversion time).

The demo model is converted once per module in each compressed format (into the session's
conversion cache); the IRs are inspected for u8/u4 weight constants and served greedily.
Agreement with fp32 is measured and printed (``-s``), not asserted equal: a random-init
~1.3 M-parameter model says little about a real model's quantization error.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from servehall import ConfigError, ModelConfig, SamplingParams, TokenDelta
from servehall.config.check import check_config_data
from servehall_openvino_cpu import plugin
from servehall_openvino_cpu.convert import MARKER, resolve_ir_dir, source_key
from servehall_openvino_cpu.options import parse_options, weight_compression

N = 16
FORMATS = ("int8_asym", "int4")


@pytest.fixture(scope="module")
def quantized_irs(ov_demo_dir: Path, ov_cache_dir: Path) -> dict[str, Path]:
    """``{weight_format: IR dir}`` of the demo model, converted once per module."""
    return {
        fmt: resolve_ir_dir(ov_demo_dir, cache_dir=ov_cache_dir, weight_format=fmt, quiet=True)
        for fmt in FORMATS
    }


def weight_types(ir_dir: Path) -> Counter[str]:
    """Element types of the IR's weight constants (2-D and larger)."""
    import openvino as ov

    model = ov.Core().read_model(str(ir_dir / "openvino_model.xml"))
    return Counter(
        op.get_output_element_type(0).get_type_name()
        for op in model.get_ops()
        if op.get_type_name() == "Constant" and len(op.get_output_shape(0)) >= 2
    )


def test_compressed_irs_hold_integer_weights_and_are_smaller(
    quantized_irs: dict[str, Path], ov_ir_dir: Path
) -> None:
    fp32 = weight_types(ov_ir_dir)
    assert not fp32.keys() & {"u8", "i8", "u4", "i4"}, fp32
    int8 = weight_types(quantized_irs["int8_asym"])
    int4 = weight_types(quantized_irs["int4"])
    assert int8["u8"] >= 28 and "u4" not in int8, int8  # 4 layers x 7 MatMuls, + embedding
    # 4-bit for the 28 MatMuls of the layers; embedding/LM head stay int8 (optimum's default)
    assert int4["u4"] >= 28 and int4["u8"] >= 1, int4
    size = {
        name: (d / "openvino_model.bin").stat().st_size
        for name, d in [("fp32", ov_ir_dir), *quantized_irs.items()]
    }
    print("IR .bin bytes:", size)
    assert size["int4"] < size["int8_asym"] < size["fp32"] / 3
    for fmt, ir in quantized_irs.items():
        marker = json.loads((ir / MARKER).read_text())
        assert marker["weight_format"] == fmt and marker["versions"]["nncf"]
        assert marker["compression"] == weight_compression(fmt)


def test_int4_group_size_that_does_not_divide_falls_back() -> None:
    """The demo model's MLP down projection has 352 inputs: 128 does not divide it, so
    NNCF's ``adjust`` fallback takes a group of 32 there (checked in the IR by the test
    above through its u4 count); the parameters say so."""
    assert weight_compression("int4") == {
        "mode": "int4_asym",
        "group_size": 128,
        "ratio": 1.0,
        "group_size_fallback": "adjust",
    }
    assert weight_compression("int8") == weight_compression("int8_asym") == {"mode": "int8_asym"}
    assert weight_compression("int4_sym", 64, 0.8)["group_size"] == 64
    assert weight_compression("fp16") is None


def test_cache_key_follows_the_compression(ov_demo_dir: Path) -> None:
    fp32 = source_key(ov_demo_dir, "fp32")
    int8 = source_key(ov_demo_dir, "int8", weight_compression("int8"))
    assert int8 == source_key(ov_demo_dir, "int8_asym", weight_compression("int8_asym"))
    int4 = source_key(ov_demo_dir, "int4", weight_compression("int4"))
    int4_64 = source_key(ov_demo_dir, "int4", weight_compression("int4", 64))
    assert len({fp32, int8, int4, int4_64}) == 4


def test_quantized_cache_is_reused(
    quantized_irs: dict[str, Path], ov_demo_dir: Path, ov_cache_dir: Path
) -> None:
    ir = quantized_irs["int8_asym"]
    before = (ir / MARKER).stat().st_mtime_ns
    again = resolve_ir_dir(ov_demo_dir, cache_dir=ov_cache_dir, weight_format="int8", quiet=True)
    assert again == ir and (ir / MARKER).stat().st_mtime_ns == before


def test_weight_format_errors_are_one_line_per_key(ov_demo_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse_options({"weight_format": "int3"}, model="m")
    ((key, msg),) = err.value.errors
    assert key == "models.m.options.weight_format" and "'int4'" in msg and "\n" not in msg
    with pytest.raises(ConfigError) as err:
        parse_options({"weight_format": "int8", "weight_group_size": 64}, model="m")
    assert err.value.errors[0][0] == "models.m.options.weight_group_size"
    assert "4-bit" in err.value.errors[0][1]
    for bad in ({"weight_group_size": 0}, {"weight_ratio": 1.5}, {"weight_ratio": 0}):
        with pytest.raises(ConfigError, match="weight_"):
            parse_options({"weight_format": "int4", **bad}, model="m")
    ok = parse_options({"weight_format": "int4_sym", "weight_group_size": -1}, model="m")
    assert ok.weight_group_size == -1
    with pytest.raises(ConfigError, match="unknown weight_format"):
        resolve_ir_dir(ov_demo_dir, cache_dir=tmp_path, weight_format="int3")
    assert not any(tmp_path.iterdir())


def test_config_check_reports_bad_options(ov_demo_dir: Path) -> None:
    """``servehall config check`` (and config load at ``serve``) validate the backend's
    options through ``BackendSpec.check_options``: one line per bad key."""
    data = {
        "plugins": {"enabled": ["openvino_cpu"]},
        "models": [
            {
                "name": "q",
                "path": str(ov_demo_dir),
                "backend": "openvino_cpu",
                "options": {"weight_format": "int3"},
            },
            {
                "name": "ok",
                "path": str(ov_demo_dir),
                "backend": "openvino_cpu",
                "options": {"weight_format": "int4", "weight_group_size": 32},
            },
        ],
    }
    errs = check_config_data(data)
    assert [k for k, _ in errs] == ["models.q.options.weight_format"], errs


async def collect(stream: AsyncIterator[TokenDelta]) -> list[int]:
    return [t async for d in stream for t in d.token_ids]


async def greedy_outputs(model: ModelConfig, prompts: list[list[int]]) -> list[list[int]]:
    engine = plugin.factory(model)
    await engine.start()
    try:
        greedy = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
        return list(
            await asyncio.gather(
                *(collect(engine.add_request(f"q{i}", p, greedy)) for i, p in enumerate(prompts))
            )
        )
    finally:
        await engine.shutdown()


def agreement(a: list[int], b: list[int]) -> float:
    """Fraction of positions equal before the first divergence."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same / max(len(a), 1)


async def test_engine_serves_greedy_completions_from_compressed_irs(
    quantized_irs: dict[str, Path],
    ov_model: Callable[..., ModelConfig],
    ov_demo_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ov_demo_dir)
    texts = ["The cat", "A small robot builds the old house", "ABCDEFGH ABCDEFGH ABC", "The"]
    prompts = [tok(t).input_ids for t in texts]
    reference = await greedy_outputs(ov_model(), prompts)
    for fmt in FORMATS:
        outs = await greedy_outputs(ov_model(weight_format=fmt), prompts)
        assert all(len(o) == N for o in outs), outs
        assert all(tok.decode(o).strip() for o in outs)
        agree = [agreement(r, o) for r, o in zip(reference, outs, strict=True)]
        print(f"{fmt}: agreement with fp32 {sum(agree) / len(agree):.2f} per prompt {agree}")
