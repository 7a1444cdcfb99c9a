"""Per-model options of the torch backends (``[[models]] options`` in config).

Validated with :class:`TorchOptions`; a bad value raises :class:`~servehall.ConfigError`
naming the key. Torch-free, so ``servehall config check`` and probes stay import-light.

Example::

    [[models]]
    name = "llama"
    path = "/models/llama-3-8b-instruct"
    backend = "cuda"
    options = { dtype = "bf16", device_index = 0, kv_cache_memory_fraction = 0.85 }
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servehall.config.options import canonical_dtype, parse_model_options

TorchDType = Literal["auto", "float32", "bfloat16", "float16"]
"""Weight/activation dtype. ``auto`` lets the device choose (CPU: float32; CUDA: bfloat16
where the device supports it, else float16)."""

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each concrete dtype (KV-cache sizing)."""


class TorchOptions(BaseModel):
    """Options shared by every torch backend (``cpu``, ``cuda``, ``rocm``, ``ascend``).

    Attributes:
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16`` (aliases ``fp32``/``f32``,
            ``bf16``, ``fp16``/``f16``); checked against the device when the engine is built.
        inference_precision: OpenVINO's name for the same thing (``f32``, ``bf16``, ``f16``),
            accepted so one options table works for ``cpu`` and ``openvino_cpu``; it must not
            contradict ``dtype``.
        device_index: index among the *visible* devices (after ``CUDA_VISIBLE_DEVICES`` /
            ``HIP_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``); None = device 0.
            Ignored by ``cpu``.
        attn_implementation: transformers attention kernel: ``sdpa`` (default, every device),
            ``eager``, or on CUDA ``flash_attention_2``/``flash_attention_3``. The continuous
            batching manager runs its *paged* variant (``paged|sdpa`` ...).
        kv_cache_blocks: KV-cache size in blocks (pages); overrides the memory fraction.
        kv_cache_memory_fraction: share in (0, 1] of the device memory that is free after the
            weights are loaded to spend on the KV cache (None = the device's default:
            0.8 for GPUs/NPUs, 0.05 of available RAM for ``cpu``, capped at 4096 blocks).
        block_size: tokens per KV-cache block.
        max_batch_tokens: most tokens (prefill + decode) in one engine step.
        prefix_caching: share full KV blocks between requests with a common prefix
            (transformers' block sharing). Off by default: shared blocks stay allocated
            after their request ends, which makes the used-blocks gauge harder to read.
    """

    model_config = ConfigDict(extra="forbid")

    dtype: TorchDType = "auto"
    inference_precision: TorchDType | None = None
    device_index: int | None = Field(default=None, ge=0)
    attn_implementation: str = "sdpa"
    kv_cache_blocks: int | None = Field(default=None, ge=1)
    kv_cache_memory_fraction: float | None = Field(default=None, gt=0, le=1)
    block_size: int = Field(default=32, ge=1, le=1024)
    max_batch_tokens: int = Field(default=256, ge=16)
    prefix_caching: bool = False

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("dtype", "inference_precision"):
                canonical = canonical_dtype(data.get(key))
                if canonical is not None:
                    data[key] = canonical
        return data

    @model_validator(mode="after")
    def _merge_precision(self) -> TorchOptions:
        ip = self.inference_precision
        if ip is not None and ip != "auto":
            if self.dtype not in ("auto", ip):
                raise ValueError(
                    f"dtype {self.dtype!r} contradicts inference_precision {ip!r}; set one"
                )
            self.dtype = ip
        if self.attn_implementation.startswith("paged|"):
            self.attn_implementation = self.attn_implementation.removeprefix("paged|")
        return self


def parse_torch_options(options: dict[str, Any], *, model: str = "?") -> TorchOptions:
    """Validate ``[[models]] options`` for a torch backend.

    Raises:
        ConfigError: a key is unknown or a value is invalid; ``errors`` lists
            ``("models.<name>.options.<key>", message)`` pairs.
    """
    return parse_model_options(
        TorchOptions, options, model=model, what=f"torch backend options for model {model!r}"
    )
