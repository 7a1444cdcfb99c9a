"""Tests of servehall.engines.torch.options: the torch backends' ``[[models]] options``."""

from __future__ import annotations

import pytest

from servehall import ConfigError
from servehall.engines.torch.options import DTYPE_BYTES, TorchOptions, parse_torch_options


def test_torch_options_aliases_and_openvino_precision_name() -> None:
    assert parse_torch_options({"dtype": "bf16"}).dtype == "bfloat16"
    assert parse_torch_options({"inference_precision": "f32"}).dtype == "float32"
    assert (
        parse_torch_options({"attn_implementation": "paged|eager"}).attn_implementation == "eager"
    )


def test_torch_options_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        parse_torch_options({"kv_cache_blockz": 3}, model="m")
    assert err.value.errors[0][0] == "models.m.options.kv_cache_blockz"
    with pytest.raises(ConfigError, match="contradicts"):
        parse_torch_options({"dtype": "bf16", "inference_precision": "f32"})
    with pytest.raises(ConfigError, match="kv_cache_memory_fraction"):
        parse_torch_options({"kv_cache_memory_fraction": 1.5})


def test_defaults() -> None:
    opts = parse_torch_options({})
    assert opts == TorchOptions()
    assert opts.dtype == "auto" and opts.device_index is None
    assert opts.attn_implementation == "sdpa" and opts.block_size == 32
    assert opts.max_batch_tokens == 256 and opts.prefix_caching is False
    assert opts.kv_cache_blocks is None and opts.kv_cache_memory_fraction is None


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [
        ("fp32", "float32"),
        ("F32", "float32"),
        ("fp16", "float16"),
        ("f16", "float16"),
        ("BF16", "bfloat16"),
        ("float16", "float16"),
        ("auto", "auto"),
    ],
)
def test_dtype_spellings(spelling: str, dtype: str) -> None:
    assert parse_torch_options({"dtype": spelling}).dtype == dtype


def test_inference_precision_agreeing_with_dtype_or_auto() -> None:
    assert parse_torch_options({"dtype": "bf16", "inference_precision": "bf16"}).dtype == "bfloat16"
    # an "auto" inference_precision leaves dtype alone
    assert parse_torch_options({"dtype": "fp16", "inference_precision": "auto"}).dtype == "float16"
    # dtype auto takes inference_precision
    assert parse_torch_options({"dtype": "auto", "inference_precision": "f16"}).dtype == "float16"


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        parse_torch_options({"dtype": "int8"}, model="m")
    assert err.value.errors[0][0] == "models.m.options.dtype"


@pytest.mark.parametrize(
    "bad",
    [
        {"device_index": -1},
        {"kv_cache_blocks": 0},
        {"kv_cache_memory_fraction": 0},
        {"block_size": 0},
        {"block_size": 1025},
        {"max_batch_tokens": 15},
    ],
)
def test_bounds_name_the_key(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_torch_options(bad, model="m")
    assert err.value.errors[0][0] == f"models.m.options.{next(iter(bad))}"


def test_bounds_accept_the_edges() -> None:
    opts = parse_torch_options(
        {"kv_cache_memory_fraction": 1, "block_size": 1024, "max_batch_tokens": 16}
    )
    assert opts.kv_cache_memory_fraction == 1 and opts.block_size == 1024


def test_paged_prefix_only_stripped_once_and_other_names_kept() -> None:
    assert parse_torch_options({"attn_implementation": "paged|sdpa"}).attn_implementation == "sdpa"
    assert (
        parse_torch_options({"attn_implementation": "flash_attention_2"}).attn_implementation
        == "flash_attention_2"
    )


def test_dtype_bytes_cover_every_concrete_dtype() -> None:
    assert DTYPE_BYTES == {"float32": 4, "bfloat16": 2, "float16": 2}
