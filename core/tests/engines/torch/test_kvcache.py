"""Tests of servehall.engines.torch.kvcache: paged KV-cache sizing."""

from __future__ import annotations

from typing import Any

import pytest

from servehall import ConfigError
from servehall.engines.torch.kvcache import KvGeometry, plan_kv_blocks


def test_kv_block_bytes_and_planning() -> None:
    geo = KvGeometry.from_hf_config(
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
        }
    )
    assert geo.block_bytes(16, 4) == 2 * 2 * 2 * 16 * 16 * 4
    kw: dict[str, Any] = dict(min_tokens=32, block_size=16, block_bytes=1000, cap=None)
    assert plan_kv_blocks(explicit_blocks=7, fraction=0.5, free_bytes=None, **kw) == 7
    assert plan_kv_blocks(explicit_blocks=None, fraction=0.5, free_bytes=100_000, **kw) == 50
    capped = {**kw, "cap": 10}
    assert plan_kv_blocks(explicit_blocks=None, fraction=0.5, free_bytes=100_000, **capped) == 10
    with pytest.raises(ConfigError, match="does not report free memory"):
        plan_kv_blocks(explicit_blocks=None, fraction=0.5, free_bytes=None, **kw)
    with pytest.raises(ConfigError, match="fewer than"):
        plan_kv_blocks(explicit_blocks=1, fraction=0.5, free_bytes=None, **kw)


def test_geometry_defaults_kv_heads_and_head_dim() -> None:
    geo = KvGeometry.from_hf_config(
        {"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 256}
    )
    assert geo == KvGeometry(num_layers=3, num_kv_heads=8, head_dim=32)
    # an explicit head_dim wins over hidden_size / heads; num_key_value_heads null → heads
    geo = KvGeometry.from_hf_config(
        {
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": None,
            "hidden_size": 64,
            "head_dim": 128,
        }
    )
    assert geo == KvGeometry(1, 4, 128)


def test_geometry_reads_text_config_of_multimodal_configs() -> None:
    cfg: dict[str, object] = {
        "model_type": "llava",
        "text_config": {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8},
    }
    assert KvGeometry.from_hf_config(cfg) == KvGeometry(2, 2, 4)


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"num_hidden_layers": 2, "num_attention_heads": 2},  # no hidden_size, no head_dim
        {"num_hidden_layers": "x", "num_attention_heads": 2, "hidden_size": 8},
        {"num_hidden_layers": None, "num_attention_heads": 2, "hidden_size": 8},
    ],
)
def test_geometry_missing_or_bad_numbers_are_config_errors(cfg: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="attention geometry"):
        KvGeometry.from_hf_config(cfg)


def test_plan_floors_and_holds_exactly_min_tokens() -> None:
    kw: dict[str, Any] = dict(explicit_blocks=None, block_bytes=1000, cap=None, block_size=16)
    # 0.5 * 9_999 = 4999.5 → 4 blocks (floor), 64 tokens: exactly the minimum is enough
    assert plan_kv_blocks(fraction=0.5, free_bytes=9_999, min_tokens=64, **kw) == 4
    with pytest.raises(ConfigError, match="holds 64 tokens, fewer than the 65"):
        plan_kv_blocks(fraction=0.5, free_bytes=9_999, min_tokens=65, **kw)


def test_explicit_blocks_ignore_cap_and_free_memory() -> None:
    blocks = plan_kv_blocks(
        explicit_blocks=100,
        fraction=0.1,
        free_bytes=1,
        block_bytes=10**9,
        cap=5,
        min_tokens=1,
        block_size=1,
    )
    assert blocks == 100


def test_cap_that_is_too_small_fails() -> None:
    with pytest.raises(ConfigError, match="fewer than"):
        plan_kv_blocks(
            explicit_blocks=None,
            fraction=1.0,
            free_bytes=10**9,
            block_bytes=1,
            cap=1,
            min_tokens=64,
            block_size=16,
        )
