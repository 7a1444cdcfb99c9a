"""The skeleton of an engine whose device work runs on one step thread.

:class:`StepThreadEngine` is the base of the ONNX Runtime engine and of the
``openvino_cpu`` plugin's OpenVINO engine (and of any engine that drives a library with a
blocking ``step()``). What it owns:

* the command queue: ``add_request`` and ``abort`` run on the event loop and put commands
  (``add``, ``abort``, ``stop``, ``wake``) on a ``queue.SimpleQueue``; the step thread
  applies them between steps, so requests join the running batch at the next step and the
  event loop never blocks;
* the live streams (:class:`~servehall.engines.kit.LiveStreams`): the step thread posts
  each step's deltas as one batch (or hands them to a step sink, see
  :class:`~servehall.engines.kit.StepSinkEngine`);
* abort: the stream ends at once with ``finish_reason="abort"`` and the step thread is
  told to cancel the request (one ``_abort_now`` for every such engine);
* health: fails once the step thread died (a failed step), after which every open
  stream ends with ``finish_reason="error"``; ``shutdown`` aborts everything, stops the
  thread and waits for it.

What a subclass provides (all on the step thread except ``_add_command``):
``_add_command`` (the ``add`` payload, built on the loop; ``ValueError``/``RuntimeError``
end the stream with an "invalid sampling parameters" error), optionally ``_enqueue`` (on
the loop: queue the payload, by default at once; the OpenVINO engine first compiles a
constrained request's grammar off the loop and queues it when done), ``_admit`` (apply an ``add``),
``_cancel`` (apply an ``abort``), ``_busy`` (requests in flight: the thread does not wait
for commands), ``_step`` (one library step: the deltas to post) and ``_close_live``
(release what is left when the thread ends). It starts the thread itself (``start``
differs per library) with :meth:`step_loop` as the target or from its own target.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from servehall.engines.contract import EngineHealth, SamplingParams, TokenDelta
from servehall.engines.kit import DeltaStream, LiveStreams
from servehall.errors import EngineError

IDLE_WAIT_S = 0.5
"""How long the idle step thread blocks on its command queue before re-checking."""


class StepThreadEngine:
    """Base of engines driven from one step thread (see the module docstring).

    Args:
        name: the model name (for messages and logs).
        label: the engine's name in messages (``"onnxruntime"``, ``"openvino_cpu"``).
        library: the library's name in the step-failure reason (``"ONNX Runtime"``).
        log: the logger step failures go to.
    """

    def __init__(self, name: str, *, label: str, library: str, log: logging.Logger) -> None:
        self.name = name
        self._label = label
        self._library = library
        self._log = log
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams = LiveStreams()  # loop thread: live requests by id
        self._dead_reason: str | None = None
        self._started = False
        self._stopped = False
        self._fault: str | None = None

    # --- what a subclass provides --------------------------------------------------------

    def _add_command(self, stream: DeltaStream, prompt: list[int], params: SamplingParams) -> Any:
        """Loop thread: the payload of the ``add`` command for this request."""
        raise NotImplementedError

    def _admit(self, command: Any) -> None:
        """Step thread: apply an ``add`` command (its stream may be done: aborted)."""
        raise NotImplementedError

    def _cancel(self, stream: DeltaStream) -> None:
        """Step thread: apply an ``abort`` command for ``stream``."""
        raise NotImplementedError

    def _busy(self) -> bool:
        """Step thread: requests are in flight (do not wait for commands)."""
        raise NotImplementedError

    def _step(self) -> list[tuple[DeltaStream, TokenDelta]]:
        """Step thread: one library step (when there is work); the deltas to post."""
        raise NotImplementedError

    def _close_live(self) -> None:
        """Step thread, as it ends: release the requests still in flight."""
        raise NotImplementedError

    # --- loop side -----------------------------------------------------------------------

    async def health(self) -> EngineHealth:
        """OK while started, not shut down, and the step thread is alive."""
        if self._dead_reason is not None:
            return EngineHealth(False, self._dead_reason)
        if self._stopped:
            return EngineHealth(False, "engine is shut down")
        if not self._started:
            return EngineHealth(False, "engine not started")
        if self._thread is None or not self._thread.is_alive():
            return EngineHealth(False, "step thread is not running")
        return EngineHealth(True)

    def set_step_sink(self, sink: Callable[[list[tuple[str, TokenDelta]]], None]) -> None:
        """Hand each step's ``(request_id, delta)`` pairs to ``sink`` on the step thread
        (see ``LiveStreams.step_sink``; the engine worker process uses it)."""
        self._streams.step_sink = sink

    async def shutdown(self) -> None:
        """Abort every request, stop the step thread and wait for it. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for rid in list(self._streams):
            self._abort_now(rid)
        self._commands.put(("stop", None))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Queue a request; it joins the running batch at the next step (see ``Engine``).

        Raises:
            ValueError: ``request_id`` is already live.
            EngineError: the engine is not started or was shut down.
        """
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already live")
        if not self._started or self._stopped:
            raise EngineError(f"{self._label} engine is not running")
        stream = DeltaStream(request_id, self._abort_now)
        if self._dead_reason is not None:
            stream.push(TokenDelta((), "error", error="engine is not healthy"))
            return stream
        if not prompt_token_ids:
            stream.push(TokenDelta((), "error", error="empty prompt"))
            return stream
        try:
            command = self._add_command(stream, list(prompt_token_ids), params)
        except (ValueError, RuntimeError) as exc:
            stream.push(TokenDelta((), "error", error=f"invalid sampling parameters: {exc}"))
            return stream
        self._streams[request_id] = stream
        self._enqueue(request_id, params, command)
        return stream

    def _enqueue(self, request_id: str, params: SamplingParams, command: Any) -> None:
        """Loop thread: queue the ``add`` command of a request now live (a subclass that
        prepares it off the loop first queues it later, unless aborted meanwhile)."""
        self._commands.put(("add", command))

    async def abort(self, request_id: str) -> None:
        """Abort a queued or running request; its cache is freed at the next step."""
        self._abort_now(request_id)

    def _abort_now(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        stream.push(TokenDelta((), "abort"))
        self._commands.put(("abort", stream))

    def _inject_fault(self, reason: str = "injected fault") -> None:
        """Test hook: make the next step fail as a device fault would."""
        self._fault = reason
        self._commands.put(("wake", None))

    # --- step thread ---------------------------------------------------------------------

    def step_loop(self) -> None:
        """Step thread: apply commands, step, post; until ``stop`` or a failed step (then
        the engine is unhealthy and every live stream ends with ``error``)."""
        try:
            while self._drain(block=not self._busy()):
                if self._fault is not None:
                    raise RuntimeError(self._fault)
                batch = self._step()
                if batch:
                    self._streams.post(batch)
        except Exception as exc:
            reason = f"{self._library} step failed: {type(exc).__name__}: {exc}"
            self._log.error("model %s: %s", self.name, reason)
            self._dead_reason = reason
            self._streams.post_fail_all()
        finally:
            self._close_live()

    def _drain(self, *, block: bool) -> bool:
        """Apply queued commands (waiting up to :data:`IDLE_WAIT_S` for the first one
        when ``block``); False on ``stop``."""
        timeout = IDLE_WAIT_S if block else None
        while True:
            try:
                kind, arg = (
                    self._commands.get(timeout=timeout) if timeout else self._commands.get_nowait()
                )
            except queue.Empty:
                return True
            timeout = None
            if kind == "stop":
                return False
            if kind == "add":
                self._admit(arg)
            elif kind == "abort":
                self._cancel(arg)
