"""``[[models]] worker``: supervision of a model's engine worker process.

Used when ``[[models]] isolation = "process"`` (the default): the engine runs in a
worker process of its own (:mod:`servehall.worker`) that the API process supervises.
Times are seconds.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class WorkerSettings(BaseModel):
    """How the API process watches and restarts one model's worker.

    Attributes:
        heartbeat_interval_s: how often the worker reports (heartbeat with its stats).
        heartbeat_timeout_s: a worker silent for this long is declared dead, unless
            ``/proc`` shows it busy (:mod:`servehall.worker.liveness`); a stopped worker
            (SIGSTOP) is declared dead after this long whatever it was doing.
        busy_timeout_s: a silent worker that ``/proc`` shows busy (a thread runnable or
            in a device/disk wait, or its CPU time advancing: starved of CPU by other
            processes, or computing with the GIL held) is declared dead only after this
            long (or ``heartbeat_timeout_s`` when that is longer). Linux only: elsewhere
            ``heartbeat_timeout_s`` applies to every silence.
        loop_timeout_s: a worker whose event loop has not refreshed its health snapshot
            for this long stops sending heartbeats (its heartbeat thread would otherwise
            vouch for a wedged loop), so it is declared dead ``heartbeat_timeout_s``
            later. Above the longest loop stall a loaded machine causes.
        step_timeout_s: with requests in flight, no step output for this long means the
            engine step is stalled (a long prefill on a CPU can take seconds: keep it
            well above the slowest step).
        start_timeout_s: longest wait for a worker to load its model and report ready.
        stop_timeout_s: on shutdown, how long a worker may take to stop before SIGKILL.
        restart_backoff_s: delay before the first restart; doubles per consecutive
            failure up to ``restart_backoff_max_s``.
        restart_backoff_max_s: the longest delay between restarts.
        crash_loop_restarts: this many restarts within ``crash_loop_window_s`` is a crash
            loop: the model stays not ready (with the last exit reason) until the host
            restarts. 0 never restarts a worker.
        crash_loop_window_s: the window of ``crash_loop_restarts``; a worker that stayed
            up this long also resets the backoff to ``restart_backoff_s``.
        switch_interval_s: the worker's ``sys.setswitchinterval``; None keeps Python's
            5 ms. OpenVINO GenAI's ``step()`` holds the GIL for its whole call, so the
            worker's event loop waits up to this long for the GIL after each of its socket
            operations (the "convoy effect"): with 5 ms a single 512-token stream reached
            the client in a few bursts up to 65-180 ms apart, with 0.0005 mostly in
            ~390 events 2-6 ms apart — but at 16 concurrent streams the smaller, more
            frequent step messages cost throughput and API CPU per token
            (docs/performance.md, "Streams in bursts"). A latency-for-throughput choice.
            Engines whose step thread sends its own output (``openvino_cpu``, ONNX
            Runtime) no longer wait for the loop, so this matters little for them.
        stream_interval_s: the least time, in seconds, between two step messages of the
            worker (0: one per engine step). A step's tokens that come sooner wait for
            the next step past the interval and leave with it, merged per request; a
            request's first tokens and its end never wait. An engine that steps faster
            than this (a tiny model) so streams a few tokens per SSE event instead of
            one, which bounds the API process's work per second; a real model's steps
            are longer and every token leaves at once. After vLLM's ``stream_interval``
            (counted there in tokens).
        python: the interpreter the worker runs under (a per-model execution
            environment, after Triton's per-model Python environments), e.g. the
            ``.venv-vllm/bin/python`` that ``scripts/install.sh --dev`` builds for the vLLM
            engine. None = the API process's own interpreter. That environment needs the
            same servehall version (and so the same wire protocol) and the backend's
            engine; the API process checks both at start (:mod:`servehall.worker.foreign`).
    """

    model_config = ConfigDict(extra="forbid")

    heartbeat_interval_s: float = Field(default=0.1, gt=0, le=10)
    heartbeat_timeout_s: float = Field(default=1.0, gt=0)
    busy_timeout_s: float = Field(default=30.0, gt=0)
    loop_timeout_s: float = Field(default=10.0, gt=0)
    step_timeout_s: float = Field(default=30.0, gt=0)
    start_timeout_s: float = Field(default=600.0, gt=0)
    stop_timeout_s: float = Field(default=10.0, ge=0)
    restart_backoff_s: float = Field(default=1.0, gt=0)
    restart_backoff_max_s: float = Field(default=60.0, gt=0)
    crash_loop_restarts: int = Field(default=5, ge=0)
    crash_loop_window_s: float = Field(default=300.0, gt=0)
    switch_interval_s: float | None = Field(default=None, gt=0, le=1)
    stream_interval_s: float = Field(default=0.02, ge=0, le=1)
    python: Path | None = None

    @field_validator("python")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser()

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be larger than heartbeat_interval_s")
        if self.loop_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("loop_timeout_s must be larger than heartbeat_interval_s")
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError("restart_backoff_max_s must be >= restart_backoff_s")
        return self
