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
from typing import TYPE_CHECKING, Any

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
) -> EngineChoice:
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
    return EngineChoice(backend, torch_device, ort_provider, vllm, vllm_dtype, default_engine)


class EngineChoice:
    """The ``BackendSpec.factory`` that :func:`engine_factory` returns (arguments: see
    there): calling it builds the engine ``options.engine`` names; :meth:`worker_defaults`
    says that engine's own defaults for the worker's supervision settings; :meth:`prepare`
    builds what that engine needs on disk before its worker starts."""

    def __init__(
        self,
        backend: str,
        torch_device: Callable[[], TorchDevice] | None,
        ort_provider: OrtProvider | None,
        vllm: bool,
        vllm_dtype: Callable[[], str | None] | None,
        default_engine: Callable[[], str] | None,
    ) -> None:
        self.backend = backend
        self.torch_device = torch_device
        self.ort_provider = ort_provider
        self.vllm = vllm
        self.vllm_dtype = vllm_dtype
        self.default_engine = default_engine
        self.__doc__ = f"Build the engine chosen by options.engine for backend {backend!r}."

    def engine_name(self, model: ModelConfig) -> str:
        """``options.engine``, else this backend's default engine."""
        default = self.default_engine() if self.default_engine is not None else DEFAULT_ENGINE
        return str(model.options.get("engine", default))

    def worker_defaults(self, model: ModelConfig) -> dict[str, Any]:
        """The chosen engine's defaults for ``[[models]] worker`` keys the config leaves
        unset (cheap: no engine is built; called in the API process). The vLLM engine's:
        :data:`~servehall.engines.vllm.options.VLLM_WORKER_DEFAULTS`."""
        if self.vllm and self.engine_name(model) == "vllm":
            from servehall.engines.vllm.options import VLLM_WORKER_DEFAULTS

            return dict(VLLM_WORKER_DEFAULTS)
        return {}

    def prepare(self, model: ModelConfig) -> None:
        """Build what the chosen engine needs on disk before its worker starts (the
        ``BackendSpec.prepare`` step, run in the API process on a thread): the ONNX
        Runtime engine's ONNX GenAI model (:func:`~servehall.engines.onnxruntime.
        resolve_onnx_dir`, cached; a no-op when built). The torch and vLLM engines load
        the Hugging Face directory as it is: nothing to build. A worker under another
        interpreter (``worker.python``) builds in its own environment, in its start.

        Raises:
            ConfigError: bad options or model directory (as the engine's constructor).
            EngineError: the build failed (the builder's log tail), e.g. a full disk.
        """
        if self.engine_name(model) != "onnxruntime" or self.ort_provider is None:
            return
        if model.worker.python is not None:
            return  # the builder must run under the worker's interpreter
        from servehall.engines.onnxruntime.build import resolve_onnx_dir
        from servehall.engines.onnxruntime.engine import OnnxRuntimeEngine

        engine = OnnxRuntimeEngine(model, self.backend, self.ort_provider)
        resolve_onnx_dir(engine.path, engine.options)

    def __call__(self, model: ModelConfig) -> Engine:
        """The unstarted engine of ``model`` (ConfigError: see :func:`engine_factory`)."""
        name = self.engine_name(model)
        backend = self.backend
        if name == "vllm" and self.vllm:
            from servehall.engines.vllm.engine import VllmEngine

            options = {"engine": "vllm", **model.options}
            return VllmEngine(
                model.model_copy(update={"options": options}),
                backend,
                default_dtype=self.vllm_dtype() if self.vllm_dtype is not None else None,
            )
        if name == "onnxruntime" and self.ort_provider is not None:
            from servehall.engines.onnxruntime.engine import OnnxRuntimeEngine

            return OnnxRuntimeEngine(model, backend, self.ort_provider)
        if name == "torch" and self.torch_device is not None:
            from servehall.engines.torch.engine import TorchEngine

            options = {k: v for k, v in model.options.items() if k != "engine"}
            plain = model.model_copy(update={"options": options})
            if model.task == "embed":
                from servehall.engines.torch.embedding import TorchEmbeddingEngine

                return TorchEmbeddingEngine(plain, self.torch_device(), backend)
            return TorchEngine(plain, self.torch_device(), backend)
        offered = [
            n
            for n, ok in (
                ("vllm", self.vllm),
                ("torch", self.torch_device),
                ("onnxruntime", self.ort_provider),
            )
            if ok
        ]
        key = f"models.{model.name}.options.engine"
        msg = f"backend {backend!r} has no engine {name!r} (choose from {', '.join(offered)})"
        raise ConfigError(f"{key}: {msg}", [(key, msg)])
