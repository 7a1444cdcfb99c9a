"""Per-model options of the ``openvino_cpu`` backend (``[[models]] options``).

Example::

    [[models]]
    name = "demo"
    path = "~/.cache/servehall/demo-model"     # Hugging Face dir (converted once) or IR dir
    backend = "openvino_cpu"
    options = { inference_precision = "f32", kv_cache_size_gb = 2, enable_prefix_caching = true }

Validated by :class:`OpenVINOOptions`; :func:`parse_options` turns errors into
:class:`~servehall.ConfigError` naming ``models.<name>.options.<key>``. OpenVINO-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from servehall import canonical_dtype, parse_model_options

KV_BLOCK_SIZE = 32
"""Tokens per KV-cache block of OpenVINO GenAI's CPU paged attention."""

DEFAULT_KV_CACHE_CAP_BYTES = 4 * 1024**3
"""When neither ``kv_cache_size_gb`` nor ``num_kv_blocks`` is set, the pool holds
``max_num_seqs`` full-length sequences, capped at this many bytes."""


WeightFormat = Literal[
    "fp32", "fp16", "int8", "int8_asym", "int8_sym", "int4", "int4_asym", "int4_sym"
]
"""Accepted ``weight_format`` values."""

WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightFormat)

DEFAULT_NUM_ASSISTANT_TOKENS = 4
"""Draft tokens proposed per step when ``draft_model`` is set without a count."""

DEFAULT_INT4_GROUP_SIZE = 128
"""optimum-cli's (and NNCF's) recommended 4-bit group size."""


def weight_compression(
    weight_format: str, group_size: int | None = None, ratio: float | None = None
) -> dict[str, Any] | None:
    """NNCF ``compress_weights`` parameters for ``weight_format`` (plain JSON values).

    Returns None for ``fp32``/``fp16`` (no compression), else ``{"mode": <NNCF mode name>}``
    (``int8`` → ``int8_asym``, ``int4`` → ``int4_asym``), plus for 4-bit modes
    ``group_size`` (default 128), ``ratio`` (default 1.0) and ``group_size_fallback``
    (``"adjust"``). Part of the conversion cache key.

    Raises:
        ValueError: an unknown ``weight_format``.
    """
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight_format {weight_format!r}; one of {WEIGHT_FORMATS}")
    if weight_format in ("fp32", "fp16"):
        return None
    mode = {"int8": "int8_asym", "int4": "int4_asym"}.get(weight_format, weight_format)
    if mode.startswith("int8"):
        return {"mode": mode}
    return {
        "mode": mode,
        "group_size": DEFAULT_INT4_GROUP_SIZE if group_size is None else group_size,
        "ratio": 1.0 if ratio is None else ratio,
        "group_size_fallback": "adjust",
    }


_OV_PRECISION: dict[str, str] = {"auto": "auto", "float32": "f32", "bfloat16": "bf16"}
"""torch dtype name → OpenVINO precision name, for the precisions this backend serves."""


def _ov_precision(value: Any) -> Any:
    """OpenVINO's name for a dtype spelling of f32/bf16/auto (``fp32`` → ``f32``);
    any other value unchanged (the model then rejects or accepts it as it is)."""
    return _OV_PRECISION.get(canonical_dtype(value) or "", value)


class OpenVINOOptions(BaseModel):
    """Options of one model served by ``openvino_cpu``.

    Attributes:
        inference_precision: compute precision of the CPU plugin (``INFERENCE_PRECISION_HINT``).
            ``"f32"`` (default) reproduces torch's float32 greedy output token for token;
            ``"bf16"`` is faster on CPUs with AVX-512 BF16/AMX (OpenVINO's own default there).
            torch spellings (``float32``, ``bfloat16``) and the key ``dtype`` are accepted.
        kv_cache_precision: element type of the KV cache. ``"auto"`` = ``f32`` with f32
            inference (exact parity), otherwise OpenVINO's CPU default (u8 on x86).
        kv_cache_size_gb: KV-cache pool size in GiB; exclusive with ``num_kv_blocks``.
        num_kv_blocks: KV-cache pool size in blocks of 32 tokens.
        max_num_seqs: most sequences in one batch (also sizes the default pool). OpenVINO
            GenAI enforces it only with ``dynamic_split_fuse = false``; with split-fuse the
            token budget ``max_num_batched_tokens`` and the KV pool bound the batch.
        max_num_batched_tokens: most tokens one step processes (prefill chunks included);
            256 (OpenVINO GenAI's default) bounds a prefilling step to ~10 ms on the demo
            model on 2 cores, which bounds what a newly arrived request waits; 2048
            prefills one long prompt ~30 % faster but holds others up to ~40-70 ms.
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes across requests.
        dynamic_split_fuse: split long prefills into chunks that share steps with decodes.
        shortest_prefill_first: OpenVINO prefills prompts in arrival order, so a short
            prompt that arrives behind long ones waits for all of their prefill. With this
            on (the default; it needs ``enable_prefix_caching``), a request whose prompt
            would not make the next step's token budget because of longer prompts still
            in prefill goes first: those are cancelled and added again right after it,
            and the prefix cache gives them back the KV blocks they had computed (their
            clients see nothing: they had no token yet). The idea of shortest-job-first
            prefill scheduling, as in Sarathi-Serve and SGLang's schedulers.
        inference_num_threads: CPU threads for inference; None = OpenVINO's choice.
        weight_format: weight precision when converting a Hugging Face directory
            (ignored for an IR directory): ``fp32`` keeps parity; ``fp16`` halves the
            weights; the integer formats compress them with NNCF weight compression
            (weights only; activations stay in ``inference_precision``): ``int8`` /
            ``int8_asym`` (8-bit asymmetric, per output channel), ``int8_sym``, ``int4`` /
            ``int4_asym`` (4-bit asymmetric in groups of ``weight_group_size``), ``int4_sym``.
            The names follow ``optimum-cli export openvino --weight-format`` (whose
            ``int8``/``int4`` are asymmetric unless ``--sym``) and NNCF's modes.
        weight_group_size: 4-bit formats only: input channels per quantization group
            (default 128; -1 = one group per output channel). A layer whose input size is
            not a multiple takes the largest group size >= 32 that divides it, else int8
            (NNCF's ``group_size_fallback_mode = ADJUST``).
        weight_ratio: 4-bit formats only: fraction (0-1] of the weights in 4 bits, the
            rest in int8_asym (default 1.0). As with optimum-cli, the embedding and the
            last MatMul (the LM head) stay in int8 whatever the ratio.
        cache_dir: where converted models are cached; None =
            ``$SERVEHALL_CACHE_DIR/openvino`` (default ``~/.cache/servehall/openvino``).
        draft_model: speculative decoding: a smaller model of the same tokenizer (an IR
            or a Hugging Face directory, converted like the main model, with the same
            ``weight_format``) that proposes tokens the main model then verifies in one
            step (OpenVINO GenAI's ``draft_model`` property). Greedy output is the main
            model's own; sampled output keeps the main model's distribution. Turns
            ``enable_prefix_caching`` (and so ``shortest_prefill_first``) off: with it on,
            OpenVINO GenAI 2026.4's speculative pipeline fails every sampled request's
            step (an explicit ``enable_prefix_caching = true`` is a config error).
        num_assistant_tokens: with ``draft_model``: tokens the draft proposes per step
            (default 4 when neither this nor ``assistant_confidence_threshold`` is set).
        assistant_confidence_threshold: with ``draft_model``, instead of a fixed count:
            the draft proposes tokens while its probability of the next one is at least
            this (0-1).
    """

    model_config = ConfigDict(extra="forbid")

    inference_precision: Literal["f32", "bf16"] = "f32"
    kv_cache_precision: Literal["auto", "f32", "bf16", "f16", "u8"] = "auto"
    kv_cache_size_gb: float | None = Field(default=None, gt=0)
    num_kv_blocks: int | None = Field(default=None, ge=1)
    max_num_seqs: int = Field(default=16, ge=1)
    max_num_batched_tokens: int = Field(default=256, ge=32)
    enable_prefix_caching: bool = True
    dynamic_split_fuse: bool = True
    shortest_prefill_first: bool = True
    inference_num_threads: int | None = Field(default=None, ge=1)
    weight_format: WeightFormat = "fp32"
    weight_group_size: int | None = None
    weight_ratio: float | None = Field(default=None, gt=0, le=1)
    cache_dir: Path | None = None
    draft_model: Path | None = None
    num_assistant_tokens: int | None = Field(default=None, ge=1)
    assistant_confidence_threshold: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        """Accept torch's spellings (``float32``, ``bfloat16``, ``fp32``...) and torch's key
        ``dtype`` (so one options table serves ``cpu`` and ``openvino_cpu``); ``dtype``
        must not contradict ``inference_precision``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        dtype = _ov_precision(data.pop("dtype", None))
        if "inference_precision" in data:
            data["inference_precision"] = _ov_precision(data["inference_precision"])
        if dtype is not None and dtype != "auto":
            ip = data.get("inference_precision")
            if ip is not None and ip != dtype:
                raise ValueError(f"dtype {dtype!r} contradicts inference_precision {ip!r}; set one")
            data["inference_precision"] = dtype
        return data

    @model_validator(mode="after")
    def _one_pool_size(self) -> OpenVINOOptions:
        if self.kv_cache_size_gb is not None and self.num_kv_blocks is not None:
            raise ValueError("set kv_cache_size_gb or num_kv_blocks, not both")
        return self

    @field_validator("draft_model")
    @classmethod
    def _draft_dir(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        path = value.expanduser()
        if not path.is_dir():
            raise ValueError(f"{path} is not a directory")
        if not (path / "config.json").is_file() and not (path / "openvino_model.xml").is_file():
            raise ValueError(
                f"{path} is neither an OpenVINO IR directory (openvino_model.xml) "
                "nor a Hugging Face model directory (config.json)"
            )
        return path

    @model_validator(mode="after")
    def _speculative(self) -> OpenVINOOptions:
        n, conf = self.num_assistant_tokens, self.assistant_confidence_threshold
        if self.draft_model is None and (n is not None or conf is not None):
            raise ValueError(
                "num_assistant_tokens / assistant_confidence_threshold need draft_model"
            )
        if n is not None and conf is not None:
            raise ValueError("set num_assistant_tokens or assistant_confidence_threshold, not both")
        if self.draft_model is not None:
            if "enable_prefix_caching" in self.model_fields_set and self.enable_prefix_caching:
                raise ValueError(
                    "enable_prefix_caching = true cannot be used with draft_model: OpenVINO "
                    "GenAI's speculative pipeline fails sampled requests with it "
                    "(content_length check in sequence_group.cpp)"
                )
            self.enable_prefix_caching = False  # see above; shortest_prefill_first needs it
        return self

    def assistant(self) -> tuple[int | None, float | None]:
        """``(num_assistant_tokens, assistant_confidence_threshold)`` for each request's
        ``GenerationConfig`` with a draft model (exactly one set: the default is 4 tokens);
        ``(None, None)`` without one."""
        if self.draft_model is None:
            return None, None
        if self.assistant_confidence_threshold is not None:
            return None, self.assistant_confidence_threshold
        return self.num_assistant_tokens or DEFAULT_NUM_ASSISTANT_TOKENS, None

    @field_validator("weight_group_size", "weight_ratio")
    @classmethod
    def _four_bit_only(cls, value: Any, info: ValidationInfo) -> Any:
        fmt = info.data.get("weight_format")
        if value is not None and fmt is not None and not str(fmt).startswith("int4"):
            raise ValueError(
                f"applies to the 4-bit weight formats only (int4, int4_asym, int4_sym), "
                f"not weight_format {fmt!r}"
            )
        gs = value if info.field_name == "weight_group_size" else None
        if gs is not None and gs != -1 and gs < 1:
            raise ValueError(f"must be a positive integer or -1 (per channel), not {value}")
        return value

    def kv_precision(self) -> str | None:
        """The ``KV_CACHE_PRECISION`` to set, or None to leave OpenVINO's default."""
        if self.kv_cache_precision != "auto":
            return self.kv_cache_precision
        return "f32" if self.inference_precision == "f32" else None

    def ov_properties(self) -> dict[str, Any]:
        """OpenVINO CPU properties for ``ContinuousBatchingPipeline(..., properties)``."""
        props: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.inference_precision}
        kv = self.kv_precision()
        if kv is not None:
            props["KV_CACHE_PRECISION"] = kv
        if self.inference_num_threads is not None:
            props["INFERENCE_NUM_THREADS"] = self.inference_num_threads
        return props


def parse_options(raw: dict[str, Any], *, model: str) -> OpenVINOOptions:
    """Validate ``raw``; raises ConfigError with one ``(key path, message)`` per error."""
    return parse_model_options(OpenVINOOptions, raw, model=model, what="openvino_cpu options")


def kv_block_bytes(hf_config: dict[str, Any], kv_precision: str | None) -> int:
    """Approximate bytes of one KV block (K and V, all layers) for a decoder config.

    Shape per block: ``2 x layers x kv_heads x head_dim x 32 tokens`` elements; ``u8``
    (or OpenVINO's default, assumed u8) adds per-token scale/zero-point overhead.
    """
    cfg = (
        hf_config.get("text_config")
        if isinstance(hf_config.get("text_config"), dict)
        else hf_config
    )
    assert isinstance(cfg, dict)
    layers = int(cfg.get("num_hidden_layers") or 1)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size") or 64) // heads)
    elem = {"f32": 4.0, "bf16": 2.0, "f16": 2.0}.get(kv_precision or "u8", 1.0 + 8.0 / head_dim)
    return max(1, int(2 * layers * kv_heads * head_dim * KV_BLOCK_SIZE * elem))


def plan_num_kv_blocks(opts: OpenVINOOptions, hf_config: dict[str, Any], max_model_len: int) -> int:
    """Number of KV blocks for the pool: explicit, from GiB, or the default plan."""
    if opts.num_kv_blocks is not None:
        return opts.num_kv_blocks
    per_block = kv_block_bytes(hf_config, opts.kv_precision())
    if opts.kv_cache_size_gb is not None:
        return max(1, int(opts.kv_cache_size_gb * 1024**3 // per_block))
    per_seq = -(-max_model_len // KV_BLOCK_SIZE)
    cap = max(per_seq, DEFAULT_KV_CACHE_CAP_BYTES // per_block)
    return int(min(opts.max_num_seqs * per_seq, cap))
