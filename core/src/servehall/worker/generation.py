"""One generation of a model's engine worker: the process, its two connections
(:mod:`servehall.worker.wire`) and its stdout/stderr (API-process side).

:class:`Generation` spawns the worker (:func:`~servehall.worker.bootstrap.worker_main`
under ``multiprocessing``'s ``spawn``, or a :class:`~servehall.worker.foreign.ForeignProcess`
under another interpreter), accepts its two connections (commands first, then reports),
hands each report to its supervisor, forwards the worker's output to this process's
stderr while keeping its last lines, sends command frames, and tears it all down. When
to start, judge, replace or give up on a generation is the supervisor's
(:class:`~servehall.worker.supervisor.WorkerSupervisor`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servehall.worker.bootstrap import WorkerSpec, worker_main
from servehall.worker.messages import WorkerReady, command_encoder, report_decoder
from servehall.worker.wire import frame, read_frame

log = logging.getLogger("servehall.worker")


class Generation:
    """One worker process and its two connections.

    Args:
        number: 1 for a model's first worker, +1 per restart.
        name: the model's name (for logs and the process name).
        stderr: the supervisor's tail of worker output lines (this generation appends).
        on_report: ``(generation, report)`` for each decoded report.
    """

    def __init__(
        self,
        number: int,
        *,
        name: str,
        stderr: collections.deque[str],
        on_report: Callable[[Generation, Any], None],
    ) -> None:
        self.number = number
        self.name = name
        self.stderr = stderr
        self.on_report = on_report
        self.loop: asyncio.AbstractEventLoop | None = None
        self.proc: Any = None
        self.commands: asyncio.StreamWriter | None = None  # API -> worker
        self.reports: asyncio.StreamWriter | None = None  # worker -> API (its transport)
        self.reports_fd = -1
        self.reader: asyncio.Task[None] | None = None
        self.failing: asyncio.Task[None] | None = None  # the supervisor's, kept referenced
        self.output_fd: int | None = None
        self.ready: asyncio.Future[None] | None = None
        self.info: WorkerReady | None = None
        self.oom_before: int | None = None
        self.partial = b""

    def spawn(
        self,
        loop: asyncio.AbstractEventLoop,
        spec: WorkerSpec,
        *,
        mp: Any,
        python: Path | None,
        spec_path: Path,
        on_exit: Callable[[Generation], None],
    ) -> None:
        """Start the worker of ``spec`` (listening on ``spec.socket_path`` first) and read
        its output, its exit and its reports on ``loop``.

        Args:
            loop: the event loop (the worker is started on its thread:
                ``PR_SET_PDEATHSIG`` follows the spawning thread).
            spec: what the worker is given.
            mp: the ``multiprocessing`` context (``spawn``).
            python: another interpreter for the worker (``worker.python``), or None.
            spec_path: where a worker under ``python`` reads its spec.
            on_exit: called with this generation once its process ended (its sentinel
                became readable; the callee removes that reader).
        """
        self.loop = loop
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(spec.socket_path)
        listener.listen(2)
        listener.setblocking(False)
        self.ready = loop.create_future()
        if python is not None:
            from servehall.worker.foreign import ForeignProcess

            proc = ForeignProcess(python, spec, spec_path)
            self.proc, self.output_fd = proc, proc.output_fd
        else:
            reader, writer = mp.Pipe(duplex=False)
            self.proc = mp.Process(
                target=worker_main,
                args=(spec, writer),
                name=f"servehall-worker-{self.name}",
                daemon=True,
            )
            self.proc.start()
            writer.close()
            self.output_fd = os.dup(reader.fileno())
            reader.close()
        assert self.output_fd is not None
        os.set_blocking(self.output_fd, False)
        loop.add_reader(self.output_fd, self.read_output)
        loop.add_reader(self.proc.sentinel, on_exit, self)
        self.reader = asyncio.ensure_future(self._read_reports(listener))

    async def _read_reports(self, listener: socket.socket) -> None:
        """Accept the worker's two connections (commands first, then reports), then
        deliver its reports until the stream ends or the task is cancelled. Frames that
        already arrived are read without a loop turn each (``read_frame``)."""
        assert self.loop is not None
        decode = report_decoder.decode
        try:
            try:
                commands, _ = await self.loop.sock_accept(listener)
                reports, _ = await self.loop.sock_accept(listener)
            finally:
                listener.close()
            _, self.commands = await asyncio.open_unix_connection(sock=commands)
            self.reports_fd = reports.fileno()
            reader, self.reports = await asyncio.open_unix_connection(sock=reports)
            while True:
                self.on_report(self, decode(await read_frame(reader)))
        except (asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            return
        except Exception:  # a malformed report: the silence that follows restarts it
            log.exception("model %s: reading the worker's reports failed", self.name)

    def reports_pending(self) -> bool:
        """Whether reports wait unread in the reports socket (readable now).

        Then a silence is this process's own: its event loop was busy or starved (the
        kernel kept receiving), and the worker is not to be judged until the reader has
        caught up. A silent worker leaves nothing pending. False when the reader task
        has ended (reports would wait forever).
        """
        if self.reports_fd < 0 or self.reader is None or self.reader.done():
            return False
        try:
            return bool(select.select([self.reports_fd], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def send(self, cmds: list[Any]) -> None:
        """Send ``cmds`` as one frame.

        The stream buffers what the socket cannot take at once: the event loop never
        blocks. Commands are sent only once the worker connected (it is ready); a dead
        worker's commands are moot: its exit handler ends its streams."""
        writer = self.commands
        if writer is None or writer.is_closing():
            return
        writer.write(frame(command_encoder.encode(cmds)))

    def read_output(self) -> None:
        """Forward the worker's stdout/stderr to ours; keep its last lines."""
        fd = self.output_fd
        if fd is None:
            return
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close_output()
                return
            data = self.partial + chunk
            *lines, self.partial = data.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                self.stderr.append(line)
                with contextlib.suppress(Exception):
                    sys.stderr.write(line + "\n")
            with contextlib.suppress(Exception):
                sys.stderr.flush()

    def close_output(self) -> None:
        """Stop reading the worker's output (its last partial line is kept)."""
        fd = self.output_fd
        if fd is None:
            return
        if self.partial:
            self.stderr.append(self.partial.decode(errors="replace"))
            self.partial = b""
        self.output_fd = None
        if self.loop is not None:
            self.loop.remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    async def wait_exit(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the process to exit."""
        deadline = time.monotonic() + timeout
        while self.proc is not None and self.proc.exitcode is None:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)

    async def teardown(self, *, kill: bool) -> None:
        """Stop watching the process (SIGKILL it and its process group when ``kill``),
        read its last output, close its connections."""
        proc = self.proc
        if proc is not None:
            if self.loop is not None:
                with contextlib.suppress(Exception):
                    self.loop.remove_reader(proc.sentinel)
            if kill and proc.exitcode is None:
                with contextlib.suppress(Exception):
                    proc.kill()
                await self.wait_exit(5.0)
            if kill:
                kill_group(proc.pid)
            with contextlib.suppress(Exception):
                proc.join(0)
            if proc.exitcode is not None and hasattr(proc, "output_fd"):  # ForeignProcess
                proc.close()
        self.read_output()
        self.close_output()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader
        for stream in (self.commands, self.reports):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
        self.commands = self.reports = None
        self.reports_fd = -1


def kill_group(pgid: int | None) -> None:
    """SIGKILL what is left of a worker's process group (the worker leads its own group,
    :func:`~servehall.worker.bootstrap.worker_main`): processes an engine started under
    it — vLLM's engine core — must not outlive it. A group with no process left is no
    error."""
    if pgid is None or pgid <= 1 or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
