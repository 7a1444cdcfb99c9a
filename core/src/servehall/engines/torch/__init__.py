"""The shared torch engine (extra ``servehall[torch]``) and its device-plugin API.

This package is the public API for torch device plugins (``cpu`` in the core; ``cuda``,
``rocm``, ``ascend`` as plugins). Importing it is cheap: torch and transformers load only
when an engine starts. A device plugin subclasses :class:`TorchDevice` and registers::

    from servehall import BackendSpec, ProbeResult, hookimpl
    from servehall.engines.torch import TorchDevice, torch_engine_factory

    class MyDevice(TorchDevice):
        type = "xpu"

    @hookimpl
    def servehall_register_backends(registry):
        registry.add(BackendSpec("xpu", probe, torch_engine_factory(MyDevice, "xpu")))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from servehall.engines.torch.device import CpuDevice, CudaApiDevice, TorchDevice
from servehall.engines.torch.kvcache import KvGeometry, plan_kv_blocks
from servehall.engines.torch.options import TorchOptions, parse_torch_options
from servehall.engines.torch.probe import DriverCount, TorchBuild, driver_device_count, torch_build

if TYPE_CHECKING:
    from servehall.config.models import ModelConfig
    from servehall.engines.torch.engine import TorchEngine

__all__ = [
    "CpuDevice",
    "CudaApiDevice",
    "DriverCount",
    "KvGeometry",
    "TorchBuild",
    "TorchDevice",
    "TorchEngine",
    "TorchOptions",
    "driver_device_count",
    "parse_torch_options",
    "plan_kv_blocks",
    "torch_build",
    "torch_engine_factory",
]


def torch_engine_factory(
    device: Callable[[], TorchDevice], backend: str
) -> Callable[[ModelConfig], TorchEngine]:
    """A ``BackendSpec.factory``: ``(ModelConfig) -> TorchEngine`` on ``device()``.

    The returned factory validates options (ConfigError) and builds an unstarted engine.
    """

    def factory(model: ModelConfig) -> TorchEngine:
        from servehall.engines.torch.engine import TorchEngine

        return TorchEngine(model, device(), backend)

    factory.__doc__ = f"Build a torch engine for backend {backend!r}."
    return factory


def __getattr__(name: str) -> Any:
    if name == "TorchEngine":
        from servehall.engines.torch.engine import TorchEngine

        return TorchEngine
    raise AttributeError(name)
