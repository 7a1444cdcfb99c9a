"""The public device-plugin API: what a device plugin (``cuda``, ``rocm``, ``ascend``, or
yours) needs from the core's shared engines — the torch engine and the ONNX Runtime GenAI
engine.

Importing this module is cheap: torch and transformers load only when an engine starts
(``TorchEngine`` itself is imported on first access). A device plugin subclasses
:class:`TorchDevice` (or :class:`CudaApiDevice` for devices driven through the
``torch.cuda`` API), writes an import-light probe with :func:`torch_build` and
:func:`driver_device_count`, and registers a backend::

    from servehall import BackendSpec, ProbeResult, hookimpl
    from servehall.devices import TorchDevice, torch_build, torch_engine_factory

    class XpuDevice(TorchDevice):
        type = "xpu"

    def probe() -> ProbeResult:
        build = torch_build()
        return ProbeResult(build.installed, f"torch {build.version}")

    @hookimpl
    def servehall_register_backends(registry):
        registry.add(BackendSpec("xpu", probe, torch_engine_factory(XpuDevice, "xpu")))

What each name is:

* :class:`TorchDevice` — the device adapter interface: ``type`` (torch device type),
  ``setup(options)``, ``resolve_dtype(options)``, ``describe(options)``,
  ``memory(options)``; :class:`CudaApiDevice` implements it for ``torch.cuda``-API
  devices (``visible_env``, ``flash_attn``); :class:`CpuDevice` is the core's ``cpu``.
* :class:`TorchOptions` / :func:`parse_torch_options` — ``[[models]] options`` of the
  torch engine (``dtype``, ``device_index``, ``attn_implementation``, KV-cache sizing).
* :class:`KvGeometry` / :func:`plan_kv_blocks` — paged KV-cache sizing.
* :class:`TorchBuild` / :func:`torch_build` — which torch is installed (CUDA, HIP or
  CPU build) without importing it; :class:`DriverCount` / :func:`driver_device_count` —
  how many devices the driver sees, without importing torch.
* :func:`torch_engine_factory` — a ``BackendSpec.factory`` building a
  :class:`TorchEngine` on a device; :class:`TorchEngine` — the engine itself.
* :func:`engine_factory` — a ``BackendSpec.factory`` offering the torch engine and/or the
  ONNX Runtime GenAI engine (``[[models]] options.engine``); :data:`OrtProvider` names an
  execution provider, :class:`OrtOptions` / :func:`parse_ort_options` are that engine's
  options, :func:`cpu_provider_status` / :func:`cuda_provider_status` probe it without
  importing onnxruntime; ``engine_factory(..., vllm=True)`` adds the vLLM engine
  (``options.engine = "vllm"``), :class:`VllmOptions` / :func:`parse_vllm_options` are its
  options, :func:`vllm_build` names the installed vLLM distribution without importing it
  and :func:`vllm_status` says whether it can run on a platform (``cuda``, ``rocm``,
  ``ascend``).

Conformance: ``servehall.testing.conformance.TinyLlamaConformance`` runs the shared
engine checks against a device plugin (see docs/backends.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servehall.engines.lazy import lazy_names
from servehall.engines.onnxruntime import (
    OrtOptions,
    OrtProvider,
    cpu_provider_status,
    cuda_provider_status,
    parse_ort_options,
)
from servehall.engines.select import engine_factory
from servehall.engines.torch import (
    CpuDevice,
    CudaApiDevice,
    DriverCount,
    KvGeometry,
    TorchBuild,
    TorchDevice,
    TorchOptions,
    driver_device_count,
    parse_torch_options,
    plan_kv_blocks,
    torch_build,
    torch_engine_factory,
)
from servehall.engines.vllm import (
    VllmBuild,
    VllmOptions,
    VllmPlatform,
    parse_vllm_options,
    vllm_build,
    vllm_status,
)

if TYPE_CHECKING:
    from servehall.engines.torch.engine import TorchEngine

__all__ = [
    "CpuDevice",
    "CudaApiDevice",
    "DriverCount",
    "KvGeometry",
    "OrtOptions",
    "OrtProvider",
    "TorchBuild",
    "TorchDevice",
    "TorchEngine",
    "TorchOptions",
    "VllmBuild",
    "VllmOptions",
    "VllmPlatform",
    "cpu_provider_status",
    "cuda_provider_status",
    "driver_device_count",
    "engine_factory",
    "parse_ort_options",
    "parse_torch_options",
    "parse_vllm_options",
    "plan_kv_blocks",
    "torch_build",
    "torch_engine_factory",
    "vllm_build",
    "vllm_status",
]


__getattr__ = lazy_names(__name__, {"TorchEngine": "servehall.engines.torch.engine"})
