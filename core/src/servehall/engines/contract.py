"""The engine interface: what a device backend hands the host.

A backend turns a model directory into an :class:`Engine`. The host reaches an engine
only through this async interface, so an engine can run on a thread of the host today
and in a supervised worker process later without changing the request path.

Shapes and units:

* token ids are ``int`` indices into the model's vocabulary;
* ``SamplingParams.max_tokens`` counts generated (decode) tokens, not prompt tokens;
* ``EngineStats`` memory figures are bytes, KV-cache figures are blocks (pages).

Continuous batching (Yu et al., "Orca", OSDI 2022; Kwon et al., "vLLM / PagedAttention",
SOSP 2023): a request joins the running batch at the next engine step and leaves it at
the step where it finishes or is aborted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from servehall.errors import ConfigError

EngineFinishReason = Literal["stop", "length", "abort", "error"]
"""Why an engine stream ended: ``stop`` = an end-of-sequence token was produced,
``length`` = ``max_tokens`` was reached, ``abort`` = :meth:`Engine.abort` was called,
``error`` = the engine failed this request (the host answers 500-free with an error)."""


@dataclass(frozen=True, slots=True)
class StructuredConstraint:
    """One engine-neutral decoding constraint (structured output, guided decoding, tools).

    Exactly one of the fields below ``any_whitespace`` is set. The API layer validates and
    normalises it once (a malformed or unsupported constraint is a 400 before any engine
    work); each engine compiles it with its own grammar backend (OpenVINO GenAI's
    ``StructuredOutputConfig``, vLLM's ``StructuredOutputsParams``, xgrammar masks in the
    torch engine, llguidance in ONNX Runtime GenAI) and lists ``"structured_output"`` in
    :attr:`Engine.supported_params` when it can.

    Attributes:
        json_schema: a JSON Schema as JSON text (``json_object`` becomes a generic object
            schema).
        regex: a regular expression the whole output must match.
        choice: the output is exactly one of these strings.
        grammar: an EBNF grammar (xgrammar / GBNF dialect) as text.
        structural_tag: a triggered structure as JSON text (xgrammar's structural tag: free
            text until a trigger such as ``<tool_call>``, then a schema-constrained body).
        any_whitespace: False (the default) bounds whitespace between JSON tokens so a weak
            model still closes the JSON in a small token budget (vLLM's
            ``disable_any_whitespace``, xgrammar's ``any_whitespace=False``).
    """

    json_schema: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    any_whitespace: bool = False


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Decoding parameters of one engine request (one choice; ``n`` is expanded by the host).

    Attributes:
        max_tokens: most tokens to generate, >= 1.
        temperature: softmax temperature, >= 0; 0 means greedy (argmax) decoding.
        top_p: nucleus-sampling mass in (0, 1] (Holtzman et al., 2020).
        seed: per-request RNG seed, or None for a non-deterministic one.
        presence_penalty, frequency_penalty: OpenAI-style penalties in [-2, 2]; an engine
            that cannot apply them lists neither in :attr:`Engine.supported_params`.
        top_k: keep only the k most likely tokens before sampling; 0 = off.
        min_p: drop tokens whose probability is below ``min_p`` times the most likely
            token's (Nguyen et al., "min-p sampling", 2024); 0 = off.
        repetition_penalty: CTRL-style penalty (Keskar et al., 2019) over every token of
            the prompt and the output so far: positive logits are divided by it,
            negative ones multiplied; 1 = off, > 1 discourages repeats. Applies to
            greedy decoding too.
        stop_token_ids: extra token ids that end the request with ``stop`` (besides EOS).
        ignore_eos: keep generating past EOS (benchmarks only).
        structured: a decoding constraint, or None for free text.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    structured: StructuredConstraint | None = None


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """Tokens produced for one request since the previous delta.

    ``token_ids`` may hold one or more ids (an engine may coalesce steps). The last delta
    of a stream has ``finish_reason`` set (its ``token_ids`` may be empty); no delta
    follows it. ``error`` carries a short, user-safe message when ``finish_reason`` is
    ``"error"``; ``code`` may say whose fault it is: ``"invalid_request"`` (the engine
    refused this request's input: the host answers 400) or ``"engine_unavailable"`` (the
    engine went away, e.g. its worker process died: 503 + ``Retry-After``); None is an
    engine failure (500).
    """

    token_ids: tuple[int, ...]
    finish_reason: EngineFinishReason | None = None
    error: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A point-in-time view of an engine, for metrics and ``/health``.

    ``kv_cache_blocks_*`` count KV-cache pages; ``device_memory_*`` are bytes (None when
    the device cannot report them) of the engine's one device (named by
    ``model_info.extra["device"]``); ``devices`` are ``(device, used bytes, total bytes)``
    per device for an engine on several devices (or one that names them itself; when
    given, metrics use these rows instead of ``device_memory_*``); ``prefix_cache_*`` are
    cumulative prompt tokens looked up in / found in the prefix cache since the engine
    started (None when the engine has no prefix cache or cannot tell); ``spec_decode``
    the speculative-decoding counters since the engine started (None for an engine
    without a draft).
    """

    running: int
    waiting: int
    kv_cache_blocks_used: int
    kv_cache_blocks_total: int
    device_memory_used_bytes: int | None = None
    device_memory_total_bytes: int | None = None
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    grammar: GrammarStats | None = None
    devices: tuple[tuple[str, int, int], ...] = ()
    spec_decode: SpecDecodeStats | None = None

    @property
    def kv_cache_usage(self) -> float:
        """KV-cache blocks used / total, in [0, 1] (0 when the total is unknown)."""
        total = self.kv_cache_blocks_total
        return min(1.0, self.kv_cache_blocks_used / total) if total else 0.0


@dataclass(frozen=True, slots=True)
class SpecDecodeStats:
    """Cumulative speculative-decoding counters of an engine with a draft (the figures
    vLLM exports as ``vllm:spec_decode_*``).

    Attributes:
        drafts: verification steps of a request in which draft tokens were proposed.
        draft_tokens: draft tokens proposed (``None`` when the engine cannot tell).
        accepted_tokens: draft tokens the model accepted.
        accepted_per_position: accepted tokens by their position in the draft (index 0 =
            the first draft token); () when the engine does not report them.
    """

    drafts: int = 0
    draft_tokens: int | None = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GrammarStats:
    """Cumulative counters of an engine's structured-output grammar cache.

    Attributes:
        hits: constraints found compiled in the cache.
        misses: constraints compiled (each one a compile, failures included).
        compile_seconds_sum: seconds spent compiling, in total.
        compile_buckets: cumulative counts of compiles that took at most each bound of
            :data:`GRAMMAR_COMPILE_BUCKETS` (Prometheus histogram buckets, ``+Inf`` =
            ``misses``).
    """

    hits: int = 0
    misses: int = 0
    compile_seconds_sum: float = 0.0
    compile_buckets: tuple[int, ...] = ()


GRAMMAR_COMPILE_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (seconds) of the grammar compile time histogram."""


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """Whether the engine can infer right now, with a reason when it cannot."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Static facts about the served model that the host needs before any engine work.

    Attributes:
        max_model_len: context length in tokens (prompt + generated).
        eos_token_ids: ids that end generation.
        vocab_size: size of the output vocabulary.
    """

    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int = 0
    extra: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """A continuous-batching inference engine for one model on one device.

    Lifecycle: the host awaits :meth:`start` once, then calls :meth:`add_request` many
    times concurrently, then awaits :meth:`shutdown`. All methods are called on the
    host's asyncio event loop; engines run their device work off the loop (a thread or a
    worker process) and must never block it.
    """

    #: Backend name that built this engine (``"openvino_cpu"``, ``"cpu"``, ...).
    backend: str
    #: Optional sampling fields this engine honours, a subset of
    #: :data:`servehall.api.sampling.OPTIONAL_SAMPLING_FIELDS` (``seed``, ``top_p``,
    #: ``presence_penalty``, ``frequency_penalty``, ``top_k``, ``min_p``,
    #: ``repetition_penalty``). The host answers 400 ``unsupported_parameter`` naming the
    #: parameter when a request sets an unsupported one to anything but its neutral value.
    #: Two capabilities are listed here too: ``"structured_output"`` (the engine applies
    #: a :class:`StructuredConstraint`) and ``"structural_tag"`` (including its
    #: ``structural_tag`` kind; ``[[models]] tool_call_grammar = "always"`` needs it).
    supported_params: frozenset[str]

    @property
    def model_info(self) -> ModelInfo:
        """Static facts about the loaded model."""
        ...

    async def start(self) -> None:
        """Load weights and start the step loop. Raises ``EngineError`` on failure."""
        ...

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        """Queue a request; iterate the result to receive its deltas in order.

        The request joins the running batch at the next step. The iterator always ends
        with a delta whose ``finish_reason`` is set — including after :meth:`abort`.
        Closing the iterator early (``aclose()``) aborts the request. ``request_id``
        must be unique among live requests (``ValueError`` otherwise).
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Abort a queued or running request and free its KV cache. Unknown ids are ignored."""
        ...

    async def health(self) -> EngineHealth:
        """Cheap check that the engine can infer (step loop alive, device reachable)."""
        ...

    def stats(self) -> EngineStats:
        """Current counters; must be cheap (called on every ``/metrics`` scrape)."""
        ...

    async def shutdown(self) -> None:
        """Abort everything, stop the step loop and release device memory. Idempotent."""
        ...


@runtime_checkable
class EmbeddingEngine(Protocol):
    """What an engine adds to serve ``[[models]] task = "embed"`` (``/v1/embeddings``).

    Optional: an engine that lacks :meth:`embed` cannot serve an embedding model, and such
    a model fails to start with a config error (:func:`check_embedding_engine`). An
    engine started for ``task = "embed"`` may refuse :meth:`Engine.add_request` (its
    stream ends with ``finish_reason="error"``, ``code="invalid_request"``); the API
    never sends it one.
    """

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input, in input order.

        Args:
            inputs: one or more token-id sequences (each non-empty, ids inside the
                vocabulary, no longer than ``model_info.max_model_len``; the API checks).

        Returns:
            ``len(inputs)`` vectors of ``model_info.extra["embedding_dim"]`` floats each, pooled
            and (when the model says so) L2-normalised the way the model was trained to be
            used.

        Raises:
            EngineUnavailableError: the engine is not running (503 + ``Retry-After``).
            InvalidRequestError: an input the engine refuses (400).
            EngineError: the engine failed (500).
        """
        ...


def check_embedding_engine(model_name: str, task: str, engine: object) -> None:
    """Refuse to serve ``task = "embed"`` on an engine without :meth:`EmbeddingEngine.embed`.

    Raises:
        ConfigError: ``task`` is ``"embed"`` and ``engine`` has no ``embed`` method.
    """
    if task == "embed" and not isinstance(engine, EmbeddingEngine):
        raise ConfigError(
            f"models.{model_name}.task: 'embed' needs an engine that can embed; "
            f"{type(engine).__name__} of backend {getattr(engine, 'backend', '?')!r} cannot "
            "(the torch and vLLM engines can: options.engine = 'torch' or 'vllm'; so can "
            "backend 'openvino_cpu')"
        )
