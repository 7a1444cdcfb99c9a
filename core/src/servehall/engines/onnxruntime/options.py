"""Per-model options of the ONNX Runtime GenAI engine (``[[models]] options``).

Chosen with ``options.engine = "onnxruntime"`` on a backend that offers it (``cpu`` in the
core, ``cuda`` in the ``servehall-cuda`` plugin); the backend fixes the default execution
provider. Torch- and onnxruntime-free, so ``servehall config check`` stays import-light.

Example::

    [[models]]
    name = "llama"
    path = "/models/llama-3-8b-instruct"     # a Hugging Face or an ONNX GenAI directory
    backend = "cuda"
    options = { engine = "onnxruntime", precision = "fp16", max_batch_size = 32 }
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servehall.config.options import parse_model_options
from servehall.errors import ConfigError

OrtProvider = Literal["cpu", "cuda"]
"""Execution provider: ``cpu`` (CPUExecutionProvider) or ``cuda`` (CUDAExecutionProvider)."""

OrtPrecision = Literal["auto", "fp32", "fp16", "bf16", "int8", "int4"]
"""Weight precision of the built model (ONNX Runtime GenAI's model builder ``-p``)."""

VALID_COMBINATIONS: dict[OrtProvider, frozenset[str]] = {
    "cpu": frozenset({"fp32", "int8", "int4"}),
    "cuda": frozenset({"fp32", "fp16", "bf16", "int8", "int4"}),
}
"""Precision × provider pairs the model builder accepts (its ``Valid precision + execution
provider combinations`` list, restricted to the providers this engine drives)."""

PRECISION_ALIASES: dict[str, str] = {
    "f32": "fp32",
    "float32": "fp32",
    "f16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}


class OptionError(ValueError):
    """Options that are valid one by one but not together; ``key`` names the culprit."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class OrtOptions(BaseModel):
    """Options of the ONNX Runtime GenAI engine.

    Attributes:
        engine: always ``"onnxruntime"`` here (the key that selects this engine).
        provider: execution provider; None = the backend's (``cpu`` for backend ``cpu``,
            ``cuda`` for backend ``cuda``).
        precision: weight precision when a Hugging Face directory is converted; ``auto`` =
            ``fp32`` on ``cpu``, ``fp16`` on ``cuda``. Ignored for an ONNX GenAI directory.
        device_index: CUDA device among the visible ones (``CUDA_VISIBLE_DEVICES``).
        max_batch_size: most requests decoded together (the engine's batch).
        paged_attention: build the model with PagedAttention for continuous batching
            (requests join the running batch at every step). ONNX Runtime supports it on
            ``cuda`` with fp16/bf16 only; None = on exactly there. Without it the engine
            batches statically: waiting requests start when the running batch drains.
        cache_dir: where converted models are kept (default
            ``$SERVEHALL_CACHE_DIR/onnxruntime``).
    """

    model_config = ConfigDict(extra="forbid")

    engine: Literal["onnxruntime"] = "onnxruntime"
    provider: OrtProvider | None = None
    precision: OrtPrecision = "auto"
    device_index: int = Field(default=0, ge=0)
    max_batch_size: int = Field(default=16, ge=1, le=256)
    paged_attention: bool | None = None
    cache_dir: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("precision"), str):
            data = dict(data)
            p = data["precision"].lower()
            data["precision"] = PRECISION_ALIASES.get(p, p)
        return data

    def resolved(self, default_provider: OrtProvider) -> OrtOptions:
        """A copy with ``provider``, ``precision`` and ``paged_attention`` made concrete.

        Raises:
            OptionError: a precision the builder cannot produce for the provider, or paged
                attention where ONNX Runtime has no kernel for it.
        """
        provider = self.provider or default_provider
        precision = self.precision
        if precision == "auto":
            precision = "fp16" if provider == "cuda" else "fp32"
        if precision not in VALID_COMBINATIONS[provider]:
            ok = ", ".join(sorted(VALID_COMBINATIONS[provider]))
            raise OptionError(
                "precision", f"precision {precision!r} is not available on {provider} ({ok})"
            )
        paged_ok = provider == "cuda" and precision in ("fp16", "bf16")
        paged = paged_ok if self.paged_attention is None else self.paged_attention
        if paged and not paged_ok:
            raise OptionError(
                "paged_attention",
                "paged_attention needs provider 'cuda' with precision fp16 or bf16 "
                "(ONNX Runtime's PagedAttention kernel)",
            )
        return self.model_copy(
            update={"provider": provider, "precision": precision, "paged_attention": paged}
        )


def parse_ort_options(
    options: dict[str, Any], *, model: str = "?", default_provider: OrtProvider = "cpu"
) -> OrtOptions:
    """Validate ``[[models]] options`` for the ONNX Runtime engine and resolve defaults.

    Raises:
        ConfigError: an unknown key or a bad value; ``errors`` lists
            ``("models.<name>.options.<key>", message)`` pairs.
    """
    opts = parse_model_options(
        OrtOptions, options, model=model, what=f"onnxruntime engine options for model {model!r}"
    )
    try:
        return opts.resolved(default_provider)
    except OptionError as exc:
        key = f"models.{model}.options.{exc.key}"
        raise ConfigError(
            f"invalid onnxruntime engine options for model {model!r}: {key}: {exc}",
            [(key, str(exc))],
        ) from None
