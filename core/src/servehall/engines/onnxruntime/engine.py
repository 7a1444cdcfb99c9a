"""The ONNX Runtime GenAI engine: ``onnxruntime_genai.Engine`` behind :class:`servehall.Engine`.

ONNX Runtime GenAI (0.18+) schedules many requests in one ``Engine``: each request is an
``og.Request`` whose *turn* is started with ``begin_turn(prompt_ids, TurnOptions)``;
``Engine.run(buffer)`` runs one step for every scheduled request and returns events
(``TOKEN`` with one new token, ``TURN_FINISHED`` with a ``FinishReason``, ``FAILED`` with
an ``EngineErrorCode``). A model built with PagedAttention (CUDA, fp16/bf16) is batched
continuously: a request joins the running batch at the next step. A model without it is
batched statically by ONNX Runtime: a request waits until the running batch drains.

This module drives it the way the ``openvino_cpu`` engine drives OpenVINO GenAI, on the
step-thread base (:class:`~servehall.engines.step_thread.StepThreadEngine`):

* **one step thread** owns the ``og.Engine``: it drains a command queue (add / abort)
  between steps, calls ``run()`` (which releases the GIL) while requests are pending, and
  hands every request's new tokens of that step, as one batch, to the asyncio loop with
  ``loop.call_soon_threadsafe``;
* **abort** ends the stream at once with ``finish_reason="abort"``; the step thread
  cancels the turn (``Request.cancel_turn``) and closes the request when ONNX Runtime
  reports it finished, which frees its KV-cache slot;
* **stop tokens** besides EOS (``SamplingParams.stop_token_ids``) are matched here, since
  ONNX Runtime only stops on EOS and stop *strings*; EOS is not emitted (ONNX Runtime
  does not report it as a token), as in the other engines;
* **stats** count requests and KV-cache *slots*: ONNX Runtime does not report paged-cache
  usage, so one "block" here is one sequence slot of ``max_batch_size`` (its length is in
  ``model_info.extra["kv_block_tokens"]``);
* **health** fails once the step thread died (a failed ``run()`` or a ``FAILED`` event
  with an engine-level error code) and every open stream then ends with ``error``.

``SamplingParams`` map onto ``og.TurnOptions``: temperature 0 → greedy; else sampling
with ``temperature``, ``top_p`` and ``top_k`` (off unless asked: the builder's config
says 50, which OpenAI clients do not expect);
``max_tokens`` → ``set_max_generated_tokens``; ``ignore_eos`` → ``set_min_generated_tokens``
(EOS masked until ``max_tokens``); ``seed`` → ``set_seed``, which ONNX Runtime offers only
with dynamic (paged) batching — elsewhere ``seed`` is not in :attr:`supported_params`.
Presence and frequency penalties have no ONNX Runtime equivalent and are refused by the
host (400 naming the field).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servehall.config.models import ModelConfig
from servehall.engines.contract import EngineStats, ModelInfo, SamplingParams, TokenDelta
from servehall.engines.kit import (
    DeltaStream,
    HfModelFacts,
    load_errors,
    read_json_object,
    token_id_tuple,
)
from servehall.engines.onnxruntime.build import GENAI_CONFIG, resolve_onnx_dir
from servehall.engines.onnxruntime.guidance import (
    GuidanceUnsupported,
    guidance_of,
    guidance_works,
)
from servehall.engines.onnxruntime.options import OrtOptions, OrtProvider, parse_ort_options
from servehall.engines.onnxruntime.probe import cuda_provider_status
from servehall.engines.step_thread import StepThreadEngine
from servehall.errors import ConfigError

log = logging.getLogger("servehall.engines.onnxruntime")

EVENT_BUFFER_CAPACITY = 1024
"""Events one ``Engine.run`` may return (at least one per scheduled request)."""

ENGINE_FAILURES = frozenset({"ENGINE_CONTRACT_FAILURE", "ENGINE_EXECUTION_FAILURE"})
"""``EngineErrorCode`` names after which the engine itself is unusable."""

_FINISH = {
    "EOS": "stop",
    "STOP_STRING": "stop",
    "MAX_GENERATED_TOKENS": "length",
    "MAX_SESSION_TOKENS": "length",
}


def _first_line(exc: BaseException) -> str:
    """The first line of an error (llguidance appends a backtrace and its state)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _refused_constraint(reason: str) -> TokenDelta:
    """The error delta of a constraint the engine cannot apply (the host answers 400)."""
    return TokenDelta(
        (), "error", error=f"The constraint is not supported: {reason}", code="invalid_request"
    )


@dataclass(slots=True)
class _Live:
    """Step-thread state of one request."""

    stream: DeltaStream
    request: Any
    turn: int
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    ended: bool = False  # the stream got its terminal delta


class OnnxRuntimeEngine(StepThreadEngine):
    """Continuous-batching engine for one model through ONNX Runtime GenAI.

    Args:
        model: the ``[[models]]`` entry; ``path`` is an ONNX GenAI directory or a Hugging
            Face directory (built once, :mod:`servehall.engines.onnxruntime.build`);
            ``options`` are validated as :class:`OrtOptions`.
        backend: the backend name reported in ``Engine.backend`` (``cpu``, ``cuda``).
        provider: the backend's execution provider (``options.provider`` overrides it).

    Raises:
        ConfigError: invalid options or a path that is not a model directory (raised here,
            before onnxruntime is imported).
    """

    def __init__(self, model: ModelConfig, backend: str, provider: OrtProvider) -> None:
        super().__init__(model.name, label="onnxruntime", library="ONNX Runtime", log=log)
        self.backend = backend
        self.path = Path(model.path).expanduser()
        self.options: OrtOptions = parse_ort_options(
            model.options, model=model.name, default_provider=provider
        )
        if not self.path.is_dir():
            raise ConfigError(f"model {model.name!r}: {self.path} is not a directory")
        self._requested_len = model.max_model_len
        self._info = self._read_info(self.path)
        params = {"top_p", "top_k"}
        if self.options.paged_attention:
            params.add("seed")  # per-turn reseeding needs ONNX Runtime's dynamic batching
        self.supported_params: frozenset[str] = frozenset(params)
        self._model_dir: Path | None = None
        self._og: Any = None
        self._model: Any = None
        self._engine: Any = None
        self._np: Any = None
        self._buffer: Any = None
        self._live: dict[int, _Live] = {}  # step thread: id(og.Request) -> state
        self._refused: list[tuple[DeltaStream, TokenDelta]] = []  # step thread

    # --- facts -------------------------------------------------------------------------

    def _read_info(self, path: Path) -> ModelInfo:
        """Context length, EOS ids and vocabulary from ``genai_config.json`` or the HF config."""
        genai = read_json_object(path / GENAI_CONFIG).get("model")
        if isinstance(genai, dict):
            native = int(genai.get("context_length") or 2048)
            eos = token_id_tuple(genai.get("eos_token_id"))
            vocab = int(genai.get("vocab_size") or 0)
        else:
            facts = HfModelFacts.read(path)
            native, eos, vocab = (
                facts.max_position_embeddings,
                facts.eos_token_ids,
                facts.vocab_size,
            )
        length = min(self._requested_len or native, native)
        return ModelInfo(max_model_len=length, eos_token_ids=eos, vocab_size=vocab)

    @property
    def model_info(self) -> ModelInfo:
        """Context length, EOS ids, vocabulary size, and the build's facts in ``extra``."""
        info = self._info
        return ModelInfo(
            max_model_len=info.max_model_len,
            eos_token_ids=info.eos_token_ids,
            vocab_size=info.vocab_size,
            extra={
                "engine": "onnxruntime",
                "provider": self.options.provider,
                "precision": self.options.precision,
                "max_batch_size": self.options.max_batch_size,
                "batching": "continuous" if self.options.paged_attention else "static",
                "kv_block_tokens": info.max_model_len,
                "model_dir": str(self._model_dir) if self._model_dir else None,
            },
        )

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Build the ONNX model if needed, load it and start the step thread.

        Raises:
            ConfigError: onnxruntime-genai is not installed, or the CUDA execution provider
                was asked for where it cannot run (the reason says why).
            EngineError: building or loading the model failed.
        """
        if self._started:
            return
        self._loop = self._streams.loop = asyncio.get_running_loop()
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise ConfigError(
                f"models.{self.name}.options.engine: 'onnxruntime' needs the onnxruntime-genai "
                "package (pip install 'servehall[onnxruntime]'; onnxruntime-genai-cuda for GPUs)"
            ) from None
        self._og = og
        if self.options.provider == "cuda":
            status = cuda_provider_status()
            if not status.available:
                raise ConfigError(
                    f"models.{self.name}.options.provider: the CUDA execution provider cannot "
                    f"run here: {status.reason}"
                )
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        with load_errors(f"onnxruntime: loading model {self.name!r} from {self.path} failed"):
            self._model_dir = await asyncio.to_thread(resolve_onnx_dir, self.path, self.options)
            self._info = self._read_info(self._model_dir)
            # ONNX Runtime GenAI binds an Engine to the thread that creates it: the step
            # thread loads the model and reports back through ``ready``.
            self._thread = threading.Thread(
                target=self._run, args=(ready,), name=f"servehall-ort-{self.name}", daemon=True
            )
            self._thread.start()
            await asyncio.wrap_future(ready)
        self._started = True

    def _load(self) -> None:
        """Step thread: load the model and create the engine (this thread owns it)."""
        og = self._og
        config = og.Config(str(self._model_dir))
        config.clear_providers()
        if self.options.provider == "cuda":
            config.append_provider("cuda")
            config.set_provider_option("cuda", "device_id", str(self.options.device_index))
        config.overlay(json.dumps({"search": {"num_beams": 1, "top_k": 0}}))
        self._model = og.Model(config)
        self._engine = og.Engine(self._model)
        if guidance_works(og, self._engine):  # llguidance in this build: structured output
            self.supported_params = self.supported_params | {"structured_output"}

    def stats(self) -> EngineStats:
        """Requests and KV-cache slots (one block = one sequence slot; see module doc)."""
        slots = self.options.max_batch_size
        live = len(self._streams)
        running = min(live, slots)
        return EngineStats(
            running=running,
            waiting=live - running,
            kv_cache_blocks_used=running,
            kv_cache_blocks_total=slots,
        )

    # --- requests ----------------------------------------------------------------------

    def _add_command(self, stream: DeltaStream, prompt: list[int], params: SamplingParams) -> Any:
        return stream, prompt, params

    # --- step thread -------------------------------------------------------------------

    def _turn_options(self, request: Any, p: SamplingParams) -> Any:
        og = self._og
        opts = og.TurnOptions(request)
        opts.set_max_generated_tokens(p.max_tokens)
        if p.ignore_eos:
            opts.set_min_generated_tokens(p.max_tokens)
        opts.set_top_k(max(p.top_k, 0))  # 0 = off (the model config says 50)
        if p.temperature <= 0:
            opts.set_do_sample(False)
        else:
            opts.set_do_sample(True)
            opts.set_temperature(p.temperature)
            opts.set_top_p(p.top_p)
            if p.seed is not None and "seed" in self.supported_params:
                opts.set_seed(p.seed % 2**63)
        if p.structured is not None:
            opts.set_guidance(*guidance_of(p.structured))  # may raise GuidanceUnsupported
        return opts

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        import numpy as np

        try:
            self._load()
            self._buffer = self._engine.create_event_buffer(EVENT_BUFFER_CAPACITY)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        self._np = np
        ready.set_result(None)
        self.step_loop()

    def _busy(self) -> bool:
        return bool(self._live)

    def _admit(self, command: Any) -> None:
        stream, prompt, params = command
        if stream.done:
            return  # aborted before it reached the engine
        request = self._engine.create_request()
        try:
            turn = request.begin_turn(
                self._np.asarray(prompt, dtype=self._np.int32), self._turn_options(request, params)
            )
        except GuidanceUnsupported as exc:
            request.close()
            self._refused.append((stream, _refused_constraint(str(exc))))
            return
        except RuntimeError as exc:  # e.g. the prompt does not fit the context
            request.close()
            if params.structured is not None:  # llguidance refused the constraint
                self._refused.append((stream, _refused_constraint(_first_line(exc))))
            else:
                self._refused.append((stream, TokenDelta((), "error", error=str(exc))))
            return
        stop_ids = frozenset(params.stop_token_ids)
        self._live[id(request)] = _Live(stream, request, turn, stop_ids)

    def _cancel(self, stream: DeltaStream) -> None:
        for entry in self._live.values():
            if entry.stream is stream and not entry.ended:
                self._end(entry)

    def _step(self) -> list[tuple[DeltaStream, TokenDelta]]:
        """The requests refused at admission, then one ``Engine.run`` if any is pending."""
        batch, self._refused = self._refused, []
        if self._engine.has_pending_requests():
            batch.extend(self._run_once(self._live, self._buffer))
        return batch

    def _close_live(self) -> None:
        for entry in self._live.values():
            with contextlib.suppress(Exception):
                entry.request.close()
        self._live.clear()
        self._engine = None  # released on the owner thread
        self._model = None

    def _run_once(
        self, live: dict[int, _Live], buffer: Any
    ) -> list[tuple[DeltaStream, TokenDelta]]:
        """One ``Engine.run``: each request's new tokens of this step as one delta.

        A request whose turn ended (finished, failed, or a stop token matched here) gets
        its terminal delta, carrying the step's tokens; the ``og.Request`` is closed once
        ONNX Runtime reports the turn over (after a cancel too), which frees its slot.
        """
        flags = self._og.EngineEventFlags
        terminal: dict[int, TokenDelta] = {}
        over: list[int] = []
        for ev in self._engine.run(buffer):
            key = id(ev.request)
            entry = live.get(key)
            if entry is None:
                continue
            bits = ev.flags
            if bits & flags.TOKEN and ev.token is not None and not entry.ended:
                token = int(ev.token)
                if token in entry.stop_ids:
                    terminal[key] = TokenDelta(tuple(entry.tokens), "stop")
                    self._end(entry)
                else:
                    entry.tokens.append(token)
            if bits & flags.FAILED:
                code = ev.error_code.name
                if code in ENGINE_FAILURES:
                    raise RuntimeError(f"engine failure {code}")
                if not entry.ended:
                    error = f"ONNX Runtime refused the request ({code})"
                    terminal[key] = TokenDelta(tuple(entry.tokens), "error", error=error)
                    entry.ended = True
                over.append(key)
            elif bits & flags.TURN_FINISHED:
                if not entry.ended:
                    reason = _FINISH.get(ev.finish_reason.name, "stop")
                    terminal[key] = TokenDelta(tuple(entry.tokens), reason)  # type: ignore[arg-type]
                    entry.ended = True
                over.append(key)
        batch: list[tuple[DeltaStream, TokenDelta]] = []
        for key, entry in live.items():
            delta = terminal.get(key)
            if delta is not None:
                batch.append((entry.stream, delta))
            elif entry.tokens and not entry.ended:
                batch.append((entry.stream, TokenDelta(tuple(entry.tokens))))
            entry.tokens = []
        for key in over:
            entry = live.pop(key)
            with contextlib.suppress(Exception):
                entry.request.close()
        return batch

    @staticmethod
    def _end(entry: _Live) -> None:
        """Stop a turn early (abort, stop token); its slot frees when ONNX Runtime says so."""
        entry.ended = True
        with contextlib.suppress(RuntimeError):
            entry.request.cancel_turn(entry.turn)
