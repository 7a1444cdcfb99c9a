"""Running out of descriptors (or socket memory) while accepting connections: one log
line per interval with a count, and a metric — never a traceback per ``accept()``.

When the process has no free file descriptor, ``accept()`` fails with ``EMFILE``
(``ENFILE``, ``ENOBUFS``, ``ENOMEM`` for the system-wide cases). asyncio's selector loop
then calls the loop's exception handler, pauses the listening socket for one second and
retries; the default handler logs a full traceback each time, and CPython 3.11 keeps
calling ``accept()`` up to ``backlog`` times in the same tick (about 100 tracebacks per
second per listener: case N32 wrote 199 MiB of them in a minute). New connections are
not lost meanwhile: they wait in the kernel's listen backlog until a descriptor is free.

:class:`AcceptErrorMonitor` is installed as the loop's exception handler by
``servehall serve``. For those errors it

* counts every failed call in ``servehall_accept_errors_total{reason}`` (``reason`` is the
  errno name, e.g. ``EMFILE``), next to the ``process_open_fds`` / ``process_max_fds``
  gauges that ``prometheus_client`` already exports on ``/metrics``;
* logs one WARNING line on the first failure, then at most one line per
  ``interval_s`` with the number of failures since the last line, the descriptors open
  and the limit (``RLIMIT_NOFILE``), and a summary line when the condition has passed.

Every other exception context goes to the handler that was there before (asyncio's
default one logs it as usual).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("servehall.server")

RESOURCE_ERRNOS: frozenset[int] = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
)
"""errno values that mean "out of a resource" rather than "this one connection failed"."""

DEFAULT_INTERVAL_S = 10.0


def open_fd_count() -> int | None:
    """Descriptors this process has open (Linux ``/proc/self/fd``), or None elsewhere."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def fd_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process."""
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def resource_error(context: dict[str, Any]) -> OSError | None:
    """The out-of-resource ``OSError`` of an asyncio exception ``context``, else None."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        return exc
    return None


class AcceptErrorMonitor:
    """Loop exception handler for out-of-resource ``accept()`` failures (module docstring).

    Args:
        registry: where ``servehall_accept_errors_total`` is registered (the app's
            :class:`~servehall.metrics.Metrics` registry); None → not exported.
        interval_s: at most one log line per this many seconds while failures go on.
        clock: monotonic seconds (tests pass a fake one).

    Attributes:
        total: failures counted since start, per errno name.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.total: dict[str, int] = {}
        self._counter = (
            Counter(
                "servehall_accept_errors",
                "Failed accept() calls because the process or system ran out of a resource "
                "(file descriptors, socket memory), by errno name",
                ["reason"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        if self._counter is not None:  # every reason exported from the start, at 0
            for number in sorted(RESOURCE_ERRNOS):
                self._counter.labels(errno.errorcode[number])
        self._pending = 0
        self._pending_reason = ""
        self._last_log: float | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self._previous: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Become ``loop``'s exception handler, keeping the previous one for the rest."""
        self._loop = loop
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def uninstall(self) -> None:
        """Give the loop its previous handler back and log what is still pending."""
        if self._loop is not None:
            self._loop.set_exception_handler(self._previous)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.flush()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = resource_error(context)
        if exc is None:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.record(exc, loop)

    def count(self, number: int) -> str:
        """Count one failure with errno ``number`` without logging it (a frontend
        process's, which logs its own: ``[server] api_processes``); its errno name."""
        reason = errno.errorcode.get(number, str(number))
        self.total[reason] = self.total.get(reason, 0) + 1
        if self._counter is not None:
            self._counter.labels(reason).inc()
        return reason

    def record(self, exc: OSError, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Count one failure; log now if the interval has passed, else later."""
        reason = self.count(exc.errno or 0)
        self._pending += 1
        self._pending_reason = reason
        now = self.clock()
        if self._last_log is None:
            self._log(first=True, strerror=exc.strerror or str(exc))
            return
        if now - self._last_log >= self.interval_s:
            self._log(first=False)
            return
        if loop is not None and self._flush_handle is None:
            delay = max(0.0, self._last_log + self.interval_s - now)
            self._flush_handle = loop.call_later(delay, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_handle = None
        self.flush()

    def flush(self) -> None:
        """Log the failures counted since the last line, if any."""
        if self._pending:
            self._log(first=False)

    def _log(self, *, first: bool, strerror: str = "") -> None:
        count, self._pending = self._pending, 0
        opened = open_fd_count()
        limit = fd_limit()
        # listing /proc/self/fd itself needs a descriptor: failing means none is free
        fds = f"{opened if opened is not None else limit} of {limit} descriptors open"
        if first:
            log.warning(
                "cannot accept connections: %s (%s); %s; new connections wait in the listen "
                "backlog and accepting is retried every second; further failures are "
                "counted in servehall_accept_errors_total and logged every %g s",
                self._pending_reason,
                strerror,
                fds,
                self.interval_s,
            )
        else:
            elapsed = self.clock() - (self._last_log or self.clock())
            log.warning(
                "cannot accept connections: %d accept() failures (%s) in the last %.0f s; %s",
                count,
                self._pending_reason,
                elapsed,
                fds,
            )
        self._last_log = self.clock()
