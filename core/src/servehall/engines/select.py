"""Choosing the engine a backend runs: ``[[models]] options.engine``.

A device backend may offer more than one engine for its device: the shared torch engine
(``engine = "torch"``, the default) and the shared ONNX Runtime GenAI engine
(``engine = "onnxruntime"``). :func:`engine_factory` builds the ``BackendSpec.factory``
that reads the key and hands the rest of the options to the chosen engine, which
validates them (unknown keys are errors naming ``models.<name>.options.<key>``).
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


def engine_factory(
    backend: str,
    *,
    torch_device: Callable[[], TorchDevice] | None = None,
    ort_provider: OrtProvider | None = None,
) -> Callable[[ModelConfig], Engine]:
    """A ``BackendSpec.factory`` offering the torch engine on ``torch_device()`` and/or the
    ONNX Runtime engine on execution provider ``ort_provider``.

    The factory raises ConfigError (``models.<name>.options.engine``) for an engine this
    backend does not offer, and whatever the chosen engine's constructor raises.
    """
    offered = [n for n, ok in (("torch", torch_device), ("onnxruntime", ort_provider)) if ok]

    def factory(model: ModelConfig) -> Engine:
        name = model.options.get("engine", DEFAULT_ENGINE)
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
