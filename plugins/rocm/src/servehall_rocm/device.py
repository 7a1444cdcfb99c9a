"""The AMD ROCm device adapter for the shared torch engine.

ROCm builds of torch drive AMD GPUs through the ``torch.cuda`` API (device ``cuda:<i>``),
so this is :class:`~servehall.devices.CudaApiDevice` with ROCm's defaults:

* visible devices: ``HIP_VISIBLE_DEVICES`` (``device_index`` counts among them);
* attention: ``sdpa`` by default; ``flash_attention_2`` only through the ROCm (Composable
  Kernel) build of ``flash-attn``; no FlashAttention-3;
* dtype ``auto``: bfloat16 where the GPU supports it (CDNA2/MI200 and newer), else float16.
"""

from __future__ import annotations

from typing import ClassVar

from servehall.devices import CudaApiDevice


class RocmDevice(CudaApiDevice):
    """An AMD GPU under torch's ROCm/HIP build."""

    type: ClassVar[str] = "cuda"  # ROCm torch exposes HIP devices as "cuda"
    visible_env: ClassVar[str] = "HIP_VISIBLE_DEVICES"
    flash_attn: ClassVar[frozenset[str]] = frozenset({"flash_attention_2"})
