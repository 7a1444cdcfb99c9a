"""The NVIDIA CUDA device adapter for the shared torch engine.

Adds to :class:`~servehall.devices.CudaApiDevice` the checks that depend on the
GPU generation (compute capability ``major.minor``):

* ``bfloat16`` needs Ampere or newer (sm_80+); ``auto`` picks bf16 there, else fp16;
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
        dtype = super().resolve_dtype(options)
        need = MIN_CAPABILITY.get(dtype)
        have = self.capability(options)
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
