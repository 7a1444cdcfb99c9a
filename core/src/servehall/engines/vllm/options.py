"""Per-model options of the vLLM engine (``[[models]] options`` with ``engine = "vllm"``).

Validated with :class:`VllmOptions` (a bad value raises :class:`~servehall.ConfigError`
naming ``models.<name>.options.<key>``); vLLM-free, so ``servehall config check`` and
probes stay import-light. Each option passes to vLLM's ``AsyncEngineArgs`` under the same
name (see :meth:`VllmOptions.engine_args`), except ``kv_cache_space_gib``, which on vLLM's
CPU build is the ``VLLM_CPU_KVCACHE_SPACE`` environment variable of the engine process,
and ``cpu_threads_bind`` (``VLLM_CPU_OMP_THREADS_BIND``).

Example::

    [[models]]
    name = "llama"
    path = "/models/llama-3-8b-instruct"
    backend = "cuda"
    options = { engine = "vllm", dtype = "bf16", gpu_memory_utilization = 0.85,
                tensor_parallel_size = 2 }
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servehall.config.options import canonical_dtype, parse_model_options

VLLM_WORKER_DEFAULTS: dict[str, Any] = {"heartbeat_timeout_s": 10.0}
"""The vLLM engine's defaults for ``[[models]] worker`` keys a config leaves unset
(:meth:`~servehall.engines.backends.BackendSpec.worker_settings`). vLLM's frontend
(input processing, structured-output grammar validation) runs in the worker process and,
on a loaded 2-core machine, was seen keeping the GIL from the worker's heartbeat thread
for over the product default of 1 s: the supervisor then took a live worker for dead."""

VllmDType = Literal["auto", "float32", "bfloat16", "float16"]
"""Weight/activation dtype (vLLM's ``--dtype``); ``auto`` lets the backend decide (the
model's dtype on a GPU that supports it; float32 is chosen by the ``cpu`` backend)."""


class VllmOptions(BaseModel):
    """Options of the shared vLLM engine.

    Attributes:
        engine: always ``"vllm"`` here (the key that selects this engine).
        dtype: ``auto`` | ``float32`` | ``bfloat16`` | ``float16`` (aliases as the torch
            engine's: ``fp32``, ``bf16``, ``fp16``...).
        gpu_memory_utilization: share in (0, 1] of the device memory vLLM may use
            (weights, activations, KV cache); None = vLLM's default (0.9).
        max_num_seqs: most sequences in one step (the running batch).
        max_num_batched_tokens: most tokens (prefill chunks + decode) in one step.
        tensor_parallel_size, pipeline_parallel_size: devices a model is split over
            (>= 1 each; the product is the number of devices, possibly over several
            nodes with ``distributed_executor_backend = "ray"``).
        distributed_executor_backend: ``mp`` (one node), ``ray`` (a Ray cluster: several
            nodes), ``uni`` (one process); None = vLLM's choice.
        enable_prefix_caching: reuse KV blocks of common prompt prefixes; None = vLLM's
            default (on).
        quantization: a vLLM quantization method (``awq``, ``gptq``, ``fp8``...); checked
            against vLLM's own list when the engine is built.
        kv_cache_space_gib: KV-cache size in GiB on vLLM's CPU build
            (``VLLM_CPU_KVCACHE_SPACE``); GPUs size it from ``gpu_memory_utilization``.
        cpu_threads_bind: vLLM CPU build's ``VLLM_CPU_OMP_THREADS_BIND`` (``auto``,
            ``nobind`` or a CPU list such as ``0-7``).
        block_size: tokens per KV-cache block; None = the platform's default.
        enforce_eager: no CUDA graphs (faster start, slower decode); None = vLLM's default.
        max_logprobs: most log-probabilities vLLM may return per token (its default 20).
        seed: vLLM's global seed (per-request seeds come with each request).
        speculative_config: vLLM's speculative decoding settings, passed through as
            ``AsyncEngineArgs(speculative_config=...)`` (a table: ``method`` — e.g.
            ``"ngram"``, ``"draft_model"``, ``"eagle"`` —, ``model`` — a draft model
            directory —, ``num_speculative_tokens``, ...; vLLM checks the keys when the
            engine is built). Checked here: ``num_speculative_tokens`` is a positive
            integer, and a ``model`` given as a path (``/``, ``./``, ``~``) is a directory.
    """

    model_config = ConfigDict(extra="forbid")

    engine: Literal["vllm"] = "vllm"
    dtype: VllmDType = "auto"
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = None
    enable_prefix_caching: bool | None = None
    quantization: str | None = Field(default=None, min_length=1)
    kv_cache_space_gib: float | None = Field(default=None, gt=0)
    cpu_threads_bind: str | None = Field(default=None, min_length=1)
    block_size: int | None = Field(default=None, ge=1, le=1024)
    enforce_eager: bool | None = None
    max_logprobs: int | None = Field(default=None, ge=0)
    seed: int = 0
    speculative_config: dict[str, Any] | None = None

    @field_validator("speculative_config")
    @classmethod
    def _speculative(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        n = value.get("num_speculative_tokens")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"num_speculative_tokens must be a positive integer, not {n!r}")
        model = value.get("model")
        if model is not None and not (isinstance(model, str) and model):
            raise ValueError(f"model must be a draft model directory, not {model!r}")
        if isinstance(model, str) and model.startswith(("/", "./", "../", "~")):
            path = Path(model).expanduser()
            if not path.is_dir():
                raise ValueError(f"model: {path} is not a directory")
            value = {**value, "model": str(path)}
        return value

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            canonical = canonical_dtype(data.get("dtype"))
            if canonical is not None:
                data = {**data, "dtype": canonical}
        return data

    @model_validator(mode="after")
    def _check(self) -> VllmOptions:
        if (
            self.max_num_seqs is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= max_num_seqs (every running sequence "
                "needs at least one token per step)"
            )
        return self

    def engine_args(self) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` keyword arguments these options set (unset ones are
        left to vLLM's defaults)."""
        keys = (
            "dtype",
            "gpu_memory_utilization",
            "max_num_seqs",
            "max_num_batched_tokens",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "distributed_executor_backend",
            "enable_prefix_caching",
            "quantization",
            "block_size",
            "enforce_eager",
            "max_logprobs",
            "seed",
            "speculative_config",
        )
        return {k: v for k in keys if (v := getattr(self, k)) is not None}

    def environment(self) -> dict[str, str]:
        """Environment variables vLLM's CPU build reads for these options."""
        env: dict[str, str] = {}
        if self.kv_cache_space_gib is not None:
            # vLLM reads whole GiB ("VLLM_CPU_KVCACHE_SPACE=4"); a fraction rounds up
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, -(-self.kv_cache_space_gib // 1)))
            env["VLLM_CPU_KVCACHE_SPACE"] = env["VLLM_CPU_KVCACHE_SPACE"].removesuffix(".0")
        if self.cpu_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads_bind
        return env


def parse_vllm_options(options: dict[str, Any], *, model: str = "?") -> VllmOptions:
    """Validate ``[[models]] options`` for the vLLM engine.

    Raises:
        ConfigError: an unknown key or a bad value; ``errors`` lists
            ``("models.<name>.options.<key>", message)`` pairs.
    """
    return parse_model_options(
        VllmOptions, options, model=model, what=f"vllm engine options for model {model!r}"
    )
