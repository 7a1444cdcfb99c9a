"""KV-cache sizing for the paged cache of transformers' continuous-batching manager.

One block (page) holds ``block_size`` tokens of keys and values for every layer:
``2 × num_layers × num_kv_heads × head_dim × block_size × dtype_bytes`` bytes
(Kwon et al., "Efficient Memory Management for LLM Serving with PagedAttention", 2023).
Torch-free: works on the model's ``config.json`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from servehall.errors import ConfigError


@dataclass(frozen=True, slots=True)
class KvGeometry:
    """Per-token KV shape of a model: layers, KV heads and head size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_hf_config(cls, config: dict[str, object]) -> KvGeometry:
        """From a Hugging Face ``config.json`` dict (``text_config`` is used when present).

        Raises ConfigError when the numbers are missing."""
        cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        assert isinstance(cfg, dict)
        try:
            layers = int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"config.json lacks the attention geometry ({exc})") from None
        return cls(layers, kv_heads, head_dim)

    def block_bytes(self, block_size: int, dtype_bytes: int) -> int:
        """Bytes of one KV block (keys + values, all layers)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * block_size * dtype_bytes


def plan_kv_blocks(
    *,
    explicit_blocks: int | None,
    fraction: float,
    free_bytes: int | None,
    block_bytes: int,
    cap: int | None,
    min_tokens: int,
    block_size: int,
) -> int:
    """Number of KV blocks to allocate.

    ``explicit_blocks`` (option ``kv_cache_blocks``) wins. Otherwise
    ``fraction × free_bytes / block_bytes``, capped at ``cap`` when given. The result must
    hold at least ``min_tokens`` (one request of ``max_model_len`` plus one batch).

    Raises:
        ConfigError: the free memory is unknown and no block count is set, or the cache
            would be smaller than ``min_tokens``.
    """
    if explicit_blocks is not None:
        blocks = explicit_blocks
    else:
        if free_bytes is None:
            raise ConfigError(
                "cannot size the KV cache: the device does not report free memory; "
                "set options.kv_cache_blocks"
            )
        blocks = int(free_bytes * fraction) // block_bytes
        if cap is not None:
            blocks = min(blocks, cap)
    if blocks * block_size < min_tokens:
        raise ConfigError(
            f"KV cache of {blocks} blocks × {block_size} tokens holds {blocks * block_size} "
            f"tokens, fewer than the {min_tokens} needed for one request of max_model_len "
            "plus one batch; raise options.kv_cache_blocks / kv_cache_memory_fraction or "
            "lower max_model_len"
        )
    return blocks
