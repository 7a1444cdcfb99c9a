"""Messages between the API process and an engine worker (msgspec/MessagePack in
length-prefixed frames, :mod:`servehall.worker.wire`).

Two Unix stream connections per worker, one each way (vLLM's engine-core split): the API
process listens; the worker connects.

* to the worker, one message = a list of commands (:class:`AddRequest`,
  :class:`AbortRequest`, :class:`EmbedRequest`, :class:`StopWorker`) gathered during one
  event-loop turn;
* from the worker: :class:`WorkerReady` or :class:`StartFailed` once, then
  :class:`StepOutput` (one per engine step: every request's new token ids),
  :class:`EmbedOutput` (one per :class:`EmbedRequest`) and :class:`Heartbeat` (every
  ``heartbeat_interval_s``, with the engine's stats).

Token ids in, token ids (or embedding vectors) out: no text crosses the boundary.
"""

from __future__ import annotations

from typing import Any

import msgspec

from servehall.engines.contract import SamplingParams, TokenDelta

WIRE_VERSION = 3
"""Version of these messages and their transport (2: length-prefixed frames on Unix
sockets, :mod:`servehall.worker.wire`; 1 was ZeroMQ). A worker under another interpreter
(``[[models]] worker.python``) must speak the same one: the API process checks it at start.
3 added :class:`EmbedRequest` and :class:`EmbedOutput`.
Bump it with any change to the messages below (or to
:class:`~servehall.engines.contract.SamplingParams`, which they carry) or to the wire."""


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    """Start ``request_id`` on ``prompt`` (token ids) with ``params``."""

    request_id: str
    prompt: list[int]
    params: SamplingParams


class AbortRequest(msgspec.Struct, tag="abort", array_like=True):
    """Abort ``request_id`` (unknown ids are ignored)."""

    request_id: str


class EmbedRequest(msgspec.Struct, tag="embed", array_like=True):
    """Embed ``inputs`` (token-id lists) with the engine's ``embed``; answered by one
    :class:`EmbedOutput` with the same ``request_id``."""

    request_id: str
    inputs: list[list[int]]


class StopWorker(msgspec.Struct, tag="stop", array_like=True):
    """Abort everything, shut the engine down and exit with status 0."""


Command = AddRequest | AbortRequest | EmbedRequest | StopWorker

DeltaTuple = tuple[str, tuple[int, ...], str | None, str | None, str | None]
"""One request's part of a step: ``(request_id, token_ids, finish_reason, error, code)``
(the fields of :class:`~servehall.engines.contract.TokenDelta`). ``finish_reason`` is any string on
the wire: a backend that strays from the four reasons must not make a whole step's
message undecodable (the serving layer reads an unknown one as ``stop``)."""


def delta_tuple(request_id: str, delta: TokenDelta) -> DeltaTuple:
    """``delta`` of ``request_id`` as the :data:`DeltaTuple` a StepOutput carries (no copy:
    MessagePack encodes the token-id tuple as an array)."""
    return (request_id, delta.token_ids, delta.finish_reason, delta.error, delta.code)


class StepOutput(msgspec.Struct, tag="step", array_like=True):
    """The deltas of one engine step (every request that got tokens or finished), and
    the engine's counters right after it: ``(running, waiting, kv_cache_blocks_used)``
    (so ``stats()`` on the API side never lags a delta)."""

    deltas: list[DeltaTuple]
    counters: tuple[int, int, int]


class EmbedOutput(msgspec.Struct, tag="embedded", array_like=True):
    """The answer to one :class:`EmbedRequest`: ``vectors`` (one per input), or
    ``error`` (a user-safe message) with ``code``: ``"invalid_request"`` (the engine
    refused the input: 400), ``"engine_unavailable"`` (503), None (an engine failure)."""

    request_id: str
    vectors: list[list[float]]
    error: str | None = None
    code: str | None = None


class Heartbeat(msgspec.Struct, tag="hb", array_like=True):
    """Liveness plus ``Engine.stats()`` and ``Engine.health()`` of the worker's engine."""

    running: int
    waiting: int
    kv_cache_blocks_used: int
    kv_cache_blocks_total: int
    device_memory_used_bytes: int | None
    device_memory_total_bytes: int | None
    healthy: bool
    reason: str
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    # the engine's grammar cache: hits, misses, compile seconds sum, cumulative buckets
    grammar: tuple[int, int, float, tuple[int, ...]] | None = None
    # (device, used bytes, total bytes) per device (EngineStats.devices)
    devices: tuple[tuple[str, int, int], ...] = ()
    # speculative decoding (EngineStats.spec_decode): drafts, draft tokens (None: unknown),
    # accepted tokens, accepted tokens per draft position
    spec_decode: tuple[int, int | None, int, tuple[int, ...]] | None = None


class WorkerReady(msgspec.Struct, tag="ready", array_like=True):
    """The engine started: the facts the API process needs about it."""

    pid: int
    backend: str
    supported_params: list[str]
    max_model_len: int
    eos_token_ids: list[int]
    vocab_size: int
    extra: dict[str, Any]


class StartFailed(msgspec.Struct, tag="failed", array_like=True):
    """The engine could not be built or started; the worker exits after sending it.

    ``error_type`` is the exception's class name (``ConfigError`` is a configuration
    problem, anything else an engine failure)."""

    error_type: str
    message: str


Report = StepOutput | EmbedOutput | Heartbeat | WorkerReady | StartFailed

command_encoder = msgspec.msgpack.Encoder()
commands_decoder = msgspec.msgpack.Decoder(list[Command])
report_encoder = msgspec.msgpack.Encoder()
report_decoder = msgspec.msgpack.Decoder(Report)
