"""The NVIDIA CUDA device adapter for the shared torch engine.

Adds to :class:`~servehall.devices.CudaApiDevice` the checks that depend on the
GPU generation (compute capability ``major.minor``):

* ``bfloat16`` needs Ampere or newer (sm_80+); ``auto`` picks bf16 there, else fp16 —
  decided from the compute capability, not ``torch.cuda.is_bf16_supported()``, which
  also counts bf16 *emulation* on sm_7x (T4, V100) as support;
* ``flash_attention_2`` needs sm_80+ and the ``flash-attn`` package;
  ``flash_attention_3`` needs Hopper (sm_90) and ``flash_attn_3``.

Device selection: ``options.device_index`` counts among the devices left visible by
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from servehall import ConfigError
from servehall.devices import CudaApiDevice, TorchOptions

MIN_CAPABILITY: dict[str, tuple[int, int]] = {
    "bfloat16": (8, 0),
    "flash_attention_2": (8, 0),
    "flash_attention_3": (9, 0),
}


def auto_dtype(capability: tuple[int, int]) -> str:
    """``dtype = "auto"`` on a GPU of compute capability ``(major, minor)``: ``bfloat16``
    from 8.0 (Ampere) on, where it runs natively, else ``float16``."""
    return "bfloat16" if capability >= MIN_CAPABILITY["bfloat16"] else "float16"


class CudaDevice(CudaApiDevice):
    """An NVIDIA GPU (torch device ``cuda:<index>``)."""

    type: ClassVar[str] = "cuda"
    visible_env: ClassVar[str] = "CUDA_VISIBLE_DEVICES"

    def capability(self, options: TorchOptions) -> tuple[int, int]:
        import torch

        major, minor = torch.cuda.get_device_capability(options.device_index or 0)
        return int(major), int(minor)

    def setup(self, options: TorchOptions) -> None:
        super().setup(options)
        need = MIN_CAPABILITY.get(options.attn_implementation)
        have = self.capability(options)
        if need is not None and have < need:
            raise ConfigError(
                f"attn_implementation {options.attn_implementation!r} needs compute capability "
                f">= {need[0]}.{need[1]}; device {options.device_index or 0} has "
                f"{have[0]}.{have[1]}; use 'sdpa'"
            )

    def resolve_dtype(self, options: TorchOptions) -> str:
        have = self.capability(options)
        if options.dtype == "auto":
            return auto_dtype(have)
        dtype = options.dtype
        need = MIN_CAPABILITY.get(dtype)
        if need is not None and have < need:
            raise ConfigError(
                f"dtype {dtype!r} needs compute capability >= {need[0]}.{need[1]}; device "
                f"{options.device_index or 0} has {have[0]}.{have[1]}; use 'float16'"
            )
        return dtype

    def describe(self, options: TorchOptions) -> dict[str, Any]:
        info = super().describe(options)
        try:
            import torch

            info["device_name"] = torch.cuda.get_device_name(options.device_index or 0)
        except Exception:
            pass
        return info
