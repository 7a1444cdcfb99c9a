"""The NPU device adapter: the shared torch engine on ``npu:<index>`` via an NpuRuntime.

* device selection: ``options.device_index`` counts among the NPUs left visible by
  ``ASCEND_RT_VISIBLE_DEVICES``; out of range is a ConfigError naming the variable;
* dtype ``auto``: bfloat16 where the NPU supports it (Atlas 800T/900 A2), else float16;
* attention: ``sdpa``/``eager`` (their paged variants are plain torch ops);
* memory: ``torch.npu.mem_get_info`` for KV sizing (default 0.8 of free memory after the
  weights) and for ``EngineStats``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from servehall import ConfigError
from servehall.devices import TorchDevice, TorchOptions
from servehall_ascend_stub.runtime import NpuRuntime, SimulatedNpuRuntime, TorchNpuRuntime

VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"


class NpuDevice(TorchDevice):
    """An Ascend NPU through ``runtime`` (default: the real ``torch_npu``)."""

    type: ClassVar[str] = "npu"
    default_kv_fraction: ClassVar[float] = 0.8
    max_default_kv_blocks: ClassVar[int | None] = None

    def __init__(self, runtime: NpuRuntime | None = None) -> None:
        self.runtime: NpuRuntime = runtime if runtime is not None else TorchNpuRuntime()

    def _index(self, options: TorchOptions) -> int:
        return options.device_index or 0

    def torch_device(self, options: TorchOptions) -> str:
        if self.runtime.device_type == "cpu":
            return "cpu"
        return f"{self.runtime.device_type}:{self._index(options)}"

    def setup(self, options: TorchOptions) -> None:
        self.runtime.load()
        count = self.runtime.device_count()
        index = self._index(options)
        if index >= count:
            env = os.environ.get(VISIBLE_ENV)
            raise ConfigError(
                f"device_index {index} is out of range: {count} NPU(s) visible"
                + (f" ({VISIBLE_ENV}={env})" if env is not None else "")
            )
        self.runtime.set_device(index)

    def thread_setup(self, options: TorchOptions) -> None:
        self.runtime.set_device(self._index(options))

    def resolve_dtype(self, options: TorchOptions) -> str:
        bf16 = self.runtime.is_bf16_supported()
        if options.dtype == "auto":
            return "bfloat16" if bf16 else "float16"
        if options.dtype == "bfloat16" and not bf16:
            raise ConfigError("dtype 'bfloat16' is not supported by this NPU; use 'float16'")
        return options.dtype

    def free_memory_bytes(self, options: TorchOptions) -> int | None:
        free, _total = self.runtime.mem_get_info(self._index(options))
        return free

    def memory_usage(self, options: TorchOptions) -> tuple[int | None, int | None]:
        try:
            free, total = self.runtime.mem_get_info(self._index(options))
        except Exception:
            return None, None
        return total - free, total

    def release(self, options: TorchOptions) -> None:
        self.runtime.empty_cache()

    def describe(self, options: TorchOptions) -> dict[str, Any]:
        return {
            "device": self.torch_device(options),
            "npu_runtime": self.runtime.name,
            VISIBLE_ENV: os.environ.get(VISIBLE_ENV),
        }


class SimulatedNpuDevice(NpuDevice):
    """:class:`NpuDevice` over :class:`SimulatedNpuRuntime` (tensors on the host CPU)."""

    def __init__(self) -> None:
        super().__init__(SimulatedNpuRuntime())
