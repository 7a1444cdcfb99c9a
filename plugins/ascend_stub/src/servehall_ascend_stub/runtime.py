"""The NPU runtime the adapter talks to: ``torch_npu`` for real, or a CPU simulation.

:class:`NpuRuntime` is the narrow set of calls the adapter makes (load the extension,
count/select devices, bf16 support, memory info, cache release). :class:`TorchNpuRuntime`
maps them onto ``torch.npu`` (provided by ``torch_npu``); :class:`SimulatedNpuRuntime`
answers them on the host CPU so the adapter's own logic — visible-device filtering,
index checks, dtype resolution, KV sizing from free memory, memory stats — runs in tests
on machines without an NPU.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol


class NpuRuntime(Protocol):
    """What the NPU adapter needs from the device runtime."""

    name: str
    device_type: str  # torch device type the engine places tensors on

    def load(self) -> None:
        """Import the runtime (``torch_npu``); raise with the reason when it cannot."""
        ...

    def device_count(self) -> int: ...

    def set_device(self, index: int) -> None: ...

    def is_bf16_supported(self) -> bool: ...

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of one device."""
        ...

    def empty_cache(self) -> None: ...


class TorchNpuRuntime:
    """The real runtime: ``torch_npu`` (``torch.npu.*``), device type ``npu``."""

    name = "torch_npu"
    device_type = "npu"

    @staticmethod
    def _npu() -> Any:
        import torch

        return getattr(torch, "npu")  # noqa: B009  (added by torch_npu at import)

    def load(self) -> None:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu; autoload may be off)

        if not hasattr(torch, "npu"):
            raise RuntimeError("torch_npu imported but torch.npu is missing")

    def device_count(self) -> int:
        return int(self._npu().device_count())

    def set_device(self, index: int) -> None:
        self._npu().set_device(index)

    def is_bf16_supported(self) -> bool:
        check = getattr(self._npu(), "is_bf16_supported", None)
        return bool(check()) if callable(check) else True

    def mem_get_info(self, index: int) -> tuple[int, int]:
        free, total = self._npu().mem_get_info(index)
        return int(free), int(total)

    def empty_cache(self) -> None:
        self._npu().empty_cache()


class SimulatedNpuRuntime:
    """A pretend NPU on the host CPU (backend ``ascend-simulated``; tests only).

    ``devices`` simulated NPUs, filtered by ``ASCEND_RT_VISIBLE_DEVICES`` exactly like the
    real runtime; each has ``memory_bytes`` of "device memory" of which this process's
    resident set counts as used. Tensors live on ``cpu``.
    """

    name = "simulated"
    device_type = "cpu"

    def __init__(self, devices: int = 1, memory_bytes: int = 8 << 30, bf16: bool = True) -> None:
        self.devices = devices
        self.memory_bytes = memory_bytes
        self.bf16 = bf16
        self.current: int | None = None
        self.set_device_threads: list[int] = []  # thread ids that selected a device
        self.cache_releases = 0

    def load(self) -> None:
        import torch  # noqa: F401

    def device_count(self) -> int:
        env = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        if env is None:
            return self.devices
        ids = [int(x) for x in env.replace(" ", "").split(",") if x.isdigit()]
        return len([i for i in ids if i < self.devices])

    def set_device(self, index: int) -> None:
        self.current = index
        self.set_device_threads.append(threading.get_ident())

    def is_bf16_supported(self) -> bool:
        return self.bf16

    def mem_get_info(self, index: int) -> tuple[int, int]:
        try:
            import psutil

            used = int(psutil.Process().memory_info().rss)
        except Exception:
            used = 0
        used = min(used, self.memory_bytes)
        return self.memory_bytes - used, self.memory_bytes

    def empty_cache(self) -> None:
        self.cache_releases += 1
