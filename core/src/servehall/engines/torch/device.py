"""Device adapters: what differs between torch devices under the shared torch engine.

A :class:`TorchDevice` tells the engine which ``torch.device`` to use, which dtypes and
attention kernels the device can run, how much memory is free for the KV cache and how
much is in use (for ``EngineStats``). Device plugins subclass it (``cuda``, ``rocm``,
``ascend``); the core ships :class:`CpuDevice` and :class:`CudaApiDevice` (any device
driven through ``torch.cuda``: NVIDIA CUDA and AMD ROCm/HIP builds).

Import-light: this module never imports torch at import time; methods that need it import
it lazily (they run only once a torch backend is selected). Methods marked *load thread*
run on the engine's loader thread, never on the event loop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from servehall.engines.torch.options import TorchOptions, parse_torch_options
from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.config.models import ModelConfig
    from servehall.engines.kit import HfModelFacts

PORTABLE_ATTN: frozenset[str] = frozenset({"sdpa", "eager"})
"""Attention kernels whose paged variant runs on every torch device (CPU included)."""


class TorchDevice:
    """Base adapter; the defaults describe a CPU.

    Subclasses set :attr:`type` (torch device type) and override what differs.

    Attributes:
        type: torch device type (``"cpu"``, ``"cuda"``, ``"npu"``).
        default_kv_fraction: KV-cache share of free memory when the options set neither
            ``kv_cache_blocks`` nor ``kv_cache_memory_fraction``.
        max_default_kv_blocks: cap on the default (not on an explicit) block count.
    """

    type: ClassVar[str] = "cpu"
    default_kv_fraction: ClassVar[float] = 0.05
    max_default_kv_blocks: ClassVar[int | None] = 4096

    def torch_device(self, options: TorchOptions) -> str:
        """The ``torch.device`` string for the engine (``"cpu"``, ``"cuda:1"``)."""
        if self.type == "cpu":
            return "cpu"
        return f"{self.type}:{options.device_index or 0}"

    def check(self, options: TorchOptions) -> None:
        """Validate options against this device without touching it (no torch import).

        Raises ConfigError. The base accepts the portable attention kernels only.
        """
        if options.attn_implementation not in PORTABLE_ATTN:
            raise ConfigError(
                f"attn_implementation {options.attn_implementation!r} is not available on "
                f"{self.type}; use one of {sorted(PORTABLE_ATTN)}"
            )

    def setup(self, options: TorchOptions) -> None:
        """*Load thread.* Prepare the device before weights load (select it, import
        vendor extensions). Raises EngineError/ConfigError."""

    def thread_setup(self, options: TorchOptions) -> None:
        """*Step thread.* Called first on the continuous-batching thread (torch's current
        device is per thread: select the engine's device there too)."""

    def resolve_dtype(self, options: TorchOptions) -> str:
        """*Load thread.* The concrete dtype name (``auto`` resolved), checked against the
        device. Raises ConfigError when the device cannot run the requested dtype."""
        return "float32" if options.dtype == "auto" else options.dtype

    def free_memory_bytes(self, options: TorchOptions) -> int | None:
        """*Load thread.* Bytes free for the KV cache now (after the weights), or None."""
        try:
            import psutil

            return int(psutil.virtual_memory().available)
        except Exception:
            return None

    def memory_usage(self, options: TorchOptions) -> tuple[int | None, int | None]:
        """``(used_bytes, total_bytes)`` of device memory for ``EngineStats``; cheap.

        CPU: resident set size of this process and physical RAM.
        """
        try:
            import psutil

            return int(psutil.Process().memory_info().rss), int(psutil.virtual_memory().total)
        except Exception:
            return None, None

    def release(self, options: TorchOptions) -> None:
        """*Load thread.* Return cached device memory to the driver after shutdown."""

    def describe(self, options: TorchOptions) -> dict[str, Any]:
        """Facts for logs and ``ModelInfo.extra`` (device string, visible-devices env)."""
        return {"device": self.torch_device(options)}


class CpuDevice(TorchDevice):
    """The host CPU (backend ``cpu``): float32 by default; bfloat16 also works in torch."""

    def resolve_dtype(self, options: TorchOptions) -> str:
        if options.dtype == "float16":
            raise ConfigError(
                "dtype 'float16' is not supported by the cpu backend (slow and inexact "
                "matmuls on CPU); use 'float32' or 'bfloat16'"
            )
        return super().resolve_dtype(options)


class CudaApiDevice(TorchDevice):
    """A device driven through the ``torch.cuda`` API (NVIDIA CUDA, AMD ROCm/HIP).

    Attributes:
        visible_env: the variable that restricts visible devices (``CUDA_VISIBLE_DEVICES``
            or ``HIP_VISIBLE_DEVICES``); ``device_index`` counts among the visible ones.
        flash_attn: attention kernels beyond the portable ones this device may run.
    """

    type: ClassVar[str] = "cuda"
    default_kv_fraction: ClassVar[float] = 0.8
    max_default_kv_blocks: ClassVar[int | None] = None
    visible_env: ClassVar[str] = "CUDA_VISIBLE_DEVICES"
    flash_attn: ClassVar[frozenset[str]] = frozenset(
        {"flash_attention_2", "flash_attention_3", "flash_attention_4"}
    )

    def check(self, options: TorchOptions) -> None:
        allowed = PORTABLE_ATTN | self.flash_attn
        if options.attn_implementation not in allowed:
            raise ConfigError(
                f"attn_implementation {options.attn_implementation!r} is not available on "
                f"{self.type}; use one of {sorted(allowed)}"
            )

    def setup(self, options: TorchOptions) -> None:
        import torch

        count = torch.cuda.device_count()
        index = options.device_index or 0
        if index >= count:
            env = os.environ.get(self.visible_env)
            raise ConfigError(
                f"device_index {index} is out of range: {count} device(s) visible"
                + (f" ({self.visible_env}={env})" if env is not None else "")
            )
        torch.cuda.set_device(index)
        if options.attn_implementation.startswith("flash_attention"):
            import importlib.util

            module = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_3"}
            name = module.get(options.attn_implementation, "flash_attn")
            if importlib.util.find_spec(name) is None:
                raise ConfigError(
                    f"attn_implementation {options.attn_implementation!r} needs the "
                    f"{name!r} package, which is not installed; use 'sdpa'"
                )

    def thread_setup(self, options: TorchOptions) -> None:
        import torch

        torch.cuda.set_device(options.device_index or 0)

    def resolve_dtype(self, options: TorchOptions) -> str:
        import torch

        index = options.device_index or 0
        bf16 = bool(torch.cuda.is_bf16_supported())
        if options.dtype == "auto":
            return "bfloat16" if bf16 else "float16"
        if options.dtype == "bfloat16" and not bf16:
            name = torch.cuda.get_device_name(index)
            raise ConfigError(
                f"dtype 'bfloat16' is not supported by {name} (device {index}); "
                "use 'float16' or 'float32'"
            )
        return options.dtype

    def free_memory_bytes(self, options: TorchOptions) -> int | None:
        import torch

        free, _total = torch.cuda.mem_get_info(options.device_index or 0)
        return int(free)

    def memory_usage(self, options: TorchOptions) -> tuple[int | None, int | None]:
        try:
            import torch

            free, total = torch.cuda.mem_get_info(options.device_index or 0)
            return int(total - free), int(total)
        except Exception:
            return None, None

    def release(self, options: TorchOptions) -> None:
        import torch

        torch.cuda.empty_cache()

    def describe(self, options: TorchOptions) -> dict[str, Any]:
        return {
            "device": self.torch_device(options),
            self.visible_env: os.environ.get(self.visible_env),
        }


def open_model(model: ModelConfig, device: TorchDevice) -> tuple[TorchOptions, HfModelFacts]:
    """What every torch engine reads before loading ``model`` on ``device``: its options
    (validated, and checked against what the device can honour) and its ``config.json``
    facts. No heavy import.

    Raises:
        ConfigError: invalid options, options the device cannot honour, no or an
            unreadable ``config.json`` in ``model.path``.
    """
    from servehall.engines.kit import HfModelFacts

    options = parse_torch_options(model.options, model=model.name)
    device.check(options)
    if not (Path(model.path) / "config.json").is_file():
        raise ConfigError(f"model {model.name!r}: {model.path} has no config.json")
    return options, HfModelFacts.read(Path(model.path))
