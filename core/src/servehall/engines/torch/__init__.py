"""The shared torch engine (extra ``servehall[torch]``), internal to the core.

Plugins reach it only through the public module :mod:`servehall.devices`, which
re-exports the device-plugin API from here. Importing this package is cheap: torch and
transformers load only when an engine starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from servehall.engines.lazy import lazy_names
from servehall.engines.torch.device import CpuDevice, CudaApiDevice, TorchDevice
from servehall.engines.torch.kvcache import KvGeometry, plan_kv_blocks
from servehall.engines.torch.options import TorchOptions, parse_torch_options
from servehall.engines.torch.probe import DriverCount, TorchBuild, driver_device_count, torch_build

if TYPE_CHECKING:
    from servehall.config.models import ModelConfig
    from servehall.engines.torch.embedding import TorchEmbeddingEngine
    from servehall.engines.torch.engine import TorchEngine

__all__ = [
    "CpuDevice",
    "CudaApiDevice",
    "DriverCount",
    "KvGeometry",
    "TorchBuild",
    "TorchDevice",
    "TorchEmbeddingEngine",
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
) -> Callable[[ModelConfig], TorchEngine | TorchEmbeddingEngine]:
    """A ``BackendSpec.factory``: ``(ModelConfig) -> TorchEngine`` on ``device()``, or a
    :class:`TorchEmbeddingEngine` for ``task = "embed"``.

    The returned factory validates options (ConfigError) and builds an unstarted engine.
    """

    def factory(model: ModelConfig) -> TorchEngine | TorchEmbeddingEngine:
        from servehall.engines.torch.engine import TorchEngine

        if model.task == "embed":
            from servehall.engines.torch.embedding import TorchEmbeddingEngine

            return TorchEmbeddingEngine(model, device(), backend)

        return TorchEngine(model, device(), backend)

    factory.__doc__ = f"Build a torch engine for backend {backend!r}."
    return factory


__getattr__ = lazy_names(
    __name__,
    {
        "TorchEngine": "servehall.engines.torch.engine",
        "TorchEmbeddingEngine": "servehall.engines.torch.embedding",
    },
)
