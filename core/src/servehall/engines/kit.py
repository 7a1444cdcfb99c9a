"""Building blocks shared by engine implementations (torch backends, ``openvino_cpu``).

* :class:`DeltaStream` — the async iterator that ``Engine.add_request`` returns: deltas
  are pushed by callbacks on the event loop; the stream is over after the delta with a
  ``finish_reason``; ``aclose()`` before that calls the engine's abort.
* :class:`HfModelFacts` — the facts an engine reads from a Hugging Face model directory
  (``config.json`` / ``generation_config.json``): EOS ids, native context length,
  vocabulary size.
* :func:`stop_token_set` — the token ids that end a request with ``finish_reason="stop"``.
* :class:`LiveStreams` — an engine's live streams, fed one batch per step by a step thread;
  :class:`StepSinkEngine` — an engine that can hand a step's output over on that thread.
* :func:`load_errors` — how an engine's ``start()`` reports a load that failed.

Import-light (no torch, no OpenVINO).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.errors import ConfigError, EngineError


class DeltaStream:
    """The async iterator of one engine request (the contract of ``Engine.add_request``).

    The engine calls :meth:`push` on the event-loop thread (directly or through
    ``loop.call_soon_threadsafe``); deltas wait in an unbounded deque, and a reader with
    nothing to read waits on one future that the next push resolves (a lighter hand-over
    than ``asyncio.Queue``'s, on a per-token path: docs/performance.md, issue 38 item 2).
    The stream yields every pushed delta in order and stops after the first delta with a
    ``finish_reason``; deltas pushed after that are dropped. ``aclose()`` before the
    terminal delta was pushed calls ``on_close(request_id)`` (the engine aborts the
    request there, normally pushing an ``"abort"`` delta).

    Args:
        request_id: the engine request id (``Engine.add_request``'s ``request_id``).
        on_close: called with ``request_id`` when the consumer closes an unfinished stream.

    Attributes:
        request_id: as given.
        done: the terminal delta was pushed (the request is over for the engine).
        ended: the terminal delta was consumed (iteration is over).

    Engines may subclass it to keep per-request state next to the stream (declare
    ``__slots__`` for the extra attributes).

    A consumer that prefers callbacks to iteration (the engine worker process, which
    batches every request's deltas of a step into one message) calls :meth:`listen`:
    deltas then go to its callback as they are pushed, with no queue and no task.
    """

    __slots__ = ("_listener", "_on_close", "_queue", "_waiter", "done", "ended", "request_id")

    def __init__(self, request_id: str, on_close: Callable[[str], None]) -> None:
        self._on_close = on_close
        self._queue: collections.deque[TokenDelta] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._listener: Callable[[str, TokenDelta], None] | None = None
        self.request_id = request_id
        self.done = False
        self.ended = False

    def push(self, delta: TokenDelta) -> None:
        """Queue ``delta`` (ignored once the terminal delta is queued). Loop thread only."""
        if self.done:
            return
        if delta.finish_reason is not None:
            self.done = True
        if self._listener is not None:
            self._listener(self.request_id, delta)
            return
        self._queue.append(delta)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def listen(self, listener: Callable[[str, TokenDelta], None]) -> None:
        """Deliver deltas as ``listener(request_id, delta)`` calls instead of queueing
        them: the deltas queued so far first, then each at :meth:`push`. The stream must
        not be iterated afterwards. Loop thread only."""
        while self._queue:
            listener(self.request_id, self._queue.popleft())
        self._listener = listener

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TokenDelta:
        if self.ended:
            raise StopAsyncIteration
        queue = self._queue
        while not queue:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting
                    self._waiter = None
        delta = queue.popleft()
        if delta.finish_reason is not None:
            self.ended = True
        return delta

    def coalesce(self, first: TokenDelta) -> TokenDelta:
        """``first`` (just taken from this stream) merged with every delta already queued
        behind it: their token ids concatenated, the last one's finish fields. A consumer
        that fell behind (a slow SSE reader) thus handles the backlog as one delta — one
        detokenizer call, one event — instead of one per step. Loop thread only."""
        queue = self._queue
        if first.finish_reason is not None or not queue:
            return first
        deltas = [first]
        while deltas[-1].finish_reason is None and queue:
            deltas.append(queue.popleft())
        merged = merge_deltas(deltas)
        if merged.finish_reason is not None:
            self.ended = True
        return merged

    async def aclose(self) -> None:
        """Stop iterating; calls ``on_close(request_id)`` when the request has not finished."""
        if not self.done:
            self._on_close(self.request_id)
        self.ended = True


def merge_deltas(deltas: Sequence[TokenDelta]) -> TokenDelta:
    """Consecutive deltas of one request as one: their token ids concatenated, the last
    one's ``finish_reason``, ``error`` and ``code``. ``deltas`` must not be empty."""
    last = deltas[-1]
    tokens = tuple(itertools.chain.from_iterable(d.token_ids for d in deltas))
    return TokenDelta(tokens, last.finish_reason, last.error, last.code)


class LiveStreams(dict[str, DeltaStream]):
    """The live requests of an engine whose step loop runs on a thread, by request id.

    The dict itself belongs to the event-loop thread (``add_request``/``abort`` fill and
    empty it). The step thread hands its results over with :meth:`post` — one batch of
    ``(stream, delta)`` pairs per engine step, delivered in one loop callback — and, after
    a fatal step error, :meth:`post_fail_all`. Set :attr:`loop` before the first post
    (``Engine.start``); posts after the loop closed are dropped. Used by the
    ``openvino_cpu`` and ONNX Runtime engines.

    A consumer that can take a whole step's output on the step thread itself (the engine
    worker process, which only forwards it to another process) sets :attr:`step_sink`
    (through the engine's ``set_step_sink``, see :class:`StepSinkEngine`): :meth:`post`
    then calls ``step_sink([(request_id, delta), ...])`` right there — no event-loop
    wake-up, no wait for the GIL to pass to the loop thread — skipping streams that have
    already ended (an abort pushed on the loop); the loop only hears of requests that
    finished, to forget them. Deltas pushed on the loop (an abort, an error at
    ``add_request``) still go through the stream's listener.
    """

    loop: asyncio.AbstractEventLoop | None = None
    step_sink: Callable[[list[tuple[str, TokenDelta]]], None] | None = None

    def post(self, batch: list[tuple[DeltaStream, TokenDelta]]) -> None:
        """Step thread: hand ``batch`` to :attr:`step_sink` if set, else deliver it on
        the loop (see :meth:`deliver`)."""
        sink = self.step_sink
        if sink is None:
            self._call_soon(self.deliver, batch)
            return
        out: list[tuple[str, TokenDelta]] = []
        ended: list[DeltaStream] = []
        for stream, delta in batch:
            if stream.done:
                continue  # ended on the loop meanwhile (aborted)
            if delta.finish_reason is not None:
                stream.done = True
                ended.append(stream)
            out.append((stream.request_id, delta))
        if out:
            sink(out)
        if ended:
            self._call_soon(self.forget, ended)

    def forget(self, ended: list[DeltaStream]) -> None:
        """Loop thread: drop the entries of these finished streams."""
        for stream in ended:
            if self.get(stream.request_id) is stream:
                del self[stream.request_id]

    def deliver(self, batch: list[tuple[DeltaStream, TokenDelta]]) -> None:
        """Loop thread: push each delta; forget requests whose terminal delta it was."""
        for stream, delta in batch:
            stream.push(delta)
            if delta.finish_reason is not None and self.get(stream.request_id) is stream:
                del self[stream.request_id]

    def post_fail_all(self, error: str = "engine step failed") -> None:
        """Step thread, after a fatal step error: end every live stream with ``error``."""

        def fail() -> None:
            for rid, stream in list(self.items()):
                stream.push(TokenDelta((), "error", error=error))
                del self[rid]

        self._call_soon(fail)

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)


@runtime_checkable
class StepSinkEngine(Protocol):
    """An engine whose step thread can hand each step's output to a thread-safe callable
    (see :attr:`LiveStreams.step_sink`); the engine worker process uses it when present.
    """

    def set_step_sink(self, sink: Callable[[list[tuple[str, TokenDelta]]], None]) -> None:
        """From now on, call ``sink`` on the step thread with each step's
        ``(request_id, delta)`` pairs instead of pushing them on the loop. Call before
        the first ``add_request``."""


@contextlib.contextmanager
def load_errors(message: str, log: logging.Logger | None = None) -> Iterator[None]:
    """Around an engine's load: a ``ConfigError`` or ``EngineError`` passes as it is; any
    other exception becomes ``EngineError(f"{message}: {type}: {exc}")`` (chained), logged
    with its traceback on ``log`` first when one is given."""
    try:
        yield
    except (ConfigError, EngineError):
        raise
    except Exception as exc:
        if log is not None:
            log.exception("%s", message)
        raise EngineError(f"{message}: {type(exc).__name__}: {exc}") from exc


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when the file is missing or holds a non-object.

    Raises:
        ConfigError: the file exists but cannot be read or is not valid JSON.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def token_id_tuple(value: Any) -> tuple[int, ...]:
    """Normalise a config's ``eos_token_id`` (an int, a list of ints, or None) to a tuple.

    Negative ids and non-integer entries are dropped; any other value gives ``()``.
    """
    if isinstance(value, int):
        return (value,) if value >= 0 else ()
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value if isinstance(v, int) and v >= 0)
    return ()


def stop_token_set(params: SamplingParams, eos_token_ids: Sequence[int]) -> frozenset[int]:
    """Token ids that end a request with ``stop``: ``params.stop_token_ids`` plus the
    model's EOS ids (unless ``params.ignore_eos``)."""
    eos: frozenset[int] = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
    return frozenset(params.stop_token_ids) | eos


@dataclass(frozen=True, slots=True)
class HfModelFacts:
    """What an engine reads from a Hugging Face model directory.

    Attributes:
        config: the parsed ``config.json`` (``{}`` when missing).
        eos_token_ids: from ``generation_config.json``'s ``eos_token_id``, else
            ``config.json``'s (a multimodal ``text_config`` is not consulted for it).
        max_position_embeddings: the model's native context length in tokens (from
            ``text_config`` when present); 2048 when the config does not say.
        vocab_size: vocabulary size (0 when the config does not say).
    """

    config: dict[str, Any] = field(default_factory=dict)
    eos_token_ids: tuple[int, ...] = ()
    max_position_embeddings: int = 2048
    vocab_size: int = 0

    @classmethod
    def read(cls, path: Path) -> HfModelFacts:
        """Read ``path/config.json`` and ``path/generation_config.json`` (both optional).

        Raises:
            ConfigError: a file exists but is not readable JSON.
        """
        config = read_json_object(path / "config.json")
        gen = read_json_object(path / "generation_config.json")
        text_cfg = config.get("text_config")
        cfg = text_cfg if isinstance(text_cfg, dict) else config
        return cls(
            config=config,
            eos_token_ids=token_id_tuple(gen.get("eos_token_id", config.get("eos_token_id"))),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
            vocab_size=int(cfg.get("vocab_size") or 0),
        )
