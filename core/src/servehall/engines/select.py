"""Choosing the engine a backend runs: ``[[models]] options.engine``.

A device backend may offer more than one engine for its device: the shared torch engine
(``engine = "torch"``, the reference), the shared ONNX Runtime GenAI engine
(``engine = "onnxruntime"``) and the shared vLLM engine (``engine = "vllm"``). Each
backend names its default (``cuda``, ``rocm`` and ``ascend``: vLLM where it is installed
for that platform, else torch; ``cpu``: torch). :func:`engine_factory` builds the
``BackendSpec.factory`` that reads the key and hands the rest of the options to the chosen
engine, which validates them (unknown keys are errors naming ``models.<name>.options.<key>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.config.models import ModelConfig
    from servehall.engines.contract import Engine
    from servehall.engines.onnxruntime.options import OrtProvider
    from servehall.engines.torch.device import TorchDevice

DEFAULT_ENGINE = "torch"
ENGINES = ("vllm", "torch", "onnxruntime")


def engine_factory(
    backend: str,
    *,
    torch_device: Callable[[], TorchDevice] | None = None,
    ort_provider: OrtProvider | None = None,
    vllm: bool = False,
    vllm_dtype: Callable[[], str | None] | None = None,
    default_engine: Callable[[], str] | None = None,
) -> Callable[[ModelConfig], Engine]:
    """A ``BackendSpec.factory`` offering the torch engine on ``torch_device()``, the
    ONNX Runtime engine on execution provider ``ort_provider`` and/or (``vllm``) the vLLM
    engine.

    Args:
        backend: the backend's name.
        torch_device: builds the torch device; None = no torch engine.
        ort_provider: ONNX Runtime's execution provider; None = no ONNX Runtime engine.
        vllm: offer the vLLM engine.
        vllm_dtype: what the vLLM engine's ``dtype = "auto"`` becomes on this backend
            (None from it: vLLM's own ``auto``).
        default_engine: the engine when ``options.engine`` is not set (called per model;
            default ``"torch"``).

    The factory raises ConfigError (``models.<name>.options.engine``) for an engine this
    backend does not offer, and whatever the chosen engine's constructor raises.
    """
    offered = [
        n
        for n, ok in (("vllm", vllm), ("torch", torch_device), ("onnxruntime", ort_provider))
        if ok
    ]

    def factory(model: ModelConfig) -> Engine:
        default = default_engine() if default_engine is not None else DEFAULT_ENGINE
        name = model.options.get("engine", default)
        if name == "vllm" and vllm:
            from servehall.engines.vllm.engine import VllmEngine

            options = {"engine": "vllm", **model.options}
            return VllmEngine(
                model.model_copy(update={"options": options}),
                backend,
                default_dtype=vllm_dtype() if vllm_dtype is not None else None,
            )
        if name == "onnxruntime" and ort_provider is not None:
            from servehall.engines.onnxruntime.engine import OnnxRuntimeEngine

            return OnnxRuntimeEngine(model, backend, ort_provider)
        if name == "torch" and torch_device is not None:
            from servehall.engines.torch.engine import TorchEngine

            options = {k: v for k, v in model.options.items() if k != "engine"}
            return TorchEngine(
                model.model_copy(update={"options": options}), torch_device(), backend
            )
        key = f"models.{model.name}.options.engine"
        msg = f"backend {backend!r} has no engine {name!r} (choose from {', '.join(offered)})"
        raise ConfigError(f"{key}: {msg}", [(key, msg)])

    factory.__doc__ = f"Build the engine chosen by options.engine for backend {backend!r}."
    return factory
