"""One sink's pipeline: bounded queue → batches → retries → spill file → replay.

Records reach a :class:`SinkRunner` through :meth:`SinkRunner.put` (synchronous, O(1),
called on the event loop thread) and are written by one background task in batches of
up to ``batch_size``, in order. While the sink fails, the task retries the same batch
with exponential backoff (``retry_initial_s`` doubling up to ``retry_max_s``).

Order-preserving overflow, oldest first:

1. ``mem`` — up to ``buffer`` records in memory;
2. the spill file (``spill_path``, JSON lines, up to ``spill_max_bytes``) — once it is in
   use every new record goes there, and it is replayed in order after ``mem`` drains;
3. ``tail`` — when memory and spill are both full ("exhausted"). A ``required`` sink
   keeps answered requests' records here (the host stops admitting new requests, see
   :attr:`SinkRunner.refusing`); other sinks drop and count records instead.

Fail closed (``required`` sinks): by default (``fail_closed = "when_exhausted"``) the
host refuses new requests only once memory *and* spill file are full — with the
defaults (10,000 records, 256 MiB of spill) that is minutes of traffic into an outage,
during which requests are answered and their records wait. ``fail_closed = "at_once"``
refuses from the first failed write until a write succeeds again. Either way the
refusals are records too (503 ``records_unavailable``): they are kept (up to
``max_refused`` of them beyond the buffer, default 100,000, then counted as dropped)
and written once the sink recovers.

Hanging writes: a ``sink.write`` that runs past ``write_timeout_s`` (default 10 s) makes
the sink unhealthy exactly as a failed write does, while the write itself goes on (a
database stopped rather than down answers nothing: without this a required sink would
never fail closed). It is not cancelled, so a write that commits late is not repeated.

Idle checks: while no record waits, a sink that offers ``async check()`` is probed every
``check_interval_s`` (default 10 s; 0 = never). A failed check makes the sink unhealthy
exactly as a failed write does (``/health/ready`` names a ``required`` one, ``at_once``
refuses), so an outage is seen without traffic; a passing check makes it healthy again.

Bad records: when a write fails with an error the sink's ``suspect(exc)`` says may come
from a record's content (for sinks without it: ``ValueError``/``TypeError``), the batch
is written record by record. A record refused alone while the sink takes a known-good one
(its ``probe()``, else its ``check()``) is quarantined — the sink's ``quarantine(record,
error)`` (the ``sql`` sink: the ``record_rejected`` table), else a JSON line in
:attr:`SinkRunner.quarantine_path` (``servehall-rejected-<sink>.jsonl`` next to the
spill file) — logged with its request id and counted (``rejected``,
``servehall_records_rejected_total``); the other records are written and the sink stays
healthy. A failing probe means an outage: the batch is retried as above (records already
written alone are not written again). The spill file's replay goes the same way, and an
unreadable spill-file line is quarantined in the file. See
:mod:`servehall.records.bad_records` (telling a bad record from an outage) and
:mod:`servehall.records.quarantine` (where it is kept).

At close, whatever could not be written is saved to the spill file (in order) and
replayed at the next start. While the spill file is replayed, the read position is saved
after each batch (``<spill_path>.pos``), so a replay cut off by a crash resumes where it
was: a restart writes nothing twice (:mod:`servehall.records.spill`).

Confirmed writes: with ``commit_wait_s`` > 0, :meth:`SinkRunner.wait_written` lets the
request path wait (up to that many seconds) until a request's record has been written
by this sink — batches still group many requests into one transaction (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from itertools import islice
from pathlib import Path
from typing import Any

from servehall.records.bad_records import BadRecords
from servehall.records.quarantine import quarantine_path
from servehall.records.spill import SpillFile
from servehall.records.types import AuditEvent, Record, RequestRecord, Sink

log = logging.getLogger("servehall.records")

FAIL_CLOSED_CODE = "records_unavailable"
"""``error_code`` of the 503 a required sink's exhaustion causes."""

RUNNER_OPTIONS = (
    "buffer",
    "batch_size",
    "linger_s",
    "spill",
    "spill_path",
    "spill_max_bytes",
    "retry_initial_s",
    "retry_max_s",
    "retry_after_s",
    "close_timeout_s",
    "commit_wait_s",
    "fail_closed",
    "max_refused",
    "check_interval_s",
    "write_timeout_s",
)
"""Keys of a ``[[sinks]] options`` table consumed by the runner, not the sink factory."""

FAIL_CLOSED_MODES = ("when_exhausted", "at_once")
"""Values of the ``fail_closed`` runner option (see the module docstring)."""


def _is_refusal(record: Record) -> bool:
    """A request record of a fail-closed refusal (503 ``records_unavailable``)."""
    return isinstance(record, RequestRecord) and record.error_code == FAIL_CLOSED_CODE


async def _wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set, at most ``seconds``; True when it is set.

    ``asyncio.timeout`` around ``Event.wait`` rather than ``asyncio.wait_for``, which wraps
    the wait in a task of its own (Python 3.11): the runner waits like this once or twice
    per batch, so at one request at a time that is a task per request saved.
    """
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
        return True
    return False


class SinkRunner:
    """Feeds one :class:`~servehall.records.types.Sink` (see module docstring).

    Args:
        sink: the sink.
        required: fail closed when exhausted (``[[sinks]] required``).
        buffer: records held in memory before spilling.
        batch_size: most records per ``sink.write`` call (one transaction for ``sql``).
        linger_s: after the queue wakes up, and after a write of less than a full
            batch, wait this long to gather a bigger batch (group commit).
        spill: False disables the spill file.
        spill_path: spill file (default ``servehall-spill-<sink>.jsonl`` in the working
            directory).
        spill_max_bytes: most unreplayed bytes in the spill file.
        retry_initial_s / retry_max_s: backoff between failed writes (seconds).
        retry_after_s: ``Retry-After`` of the fail-closed 503 (seconds).
        close_timeout_s: how long ``close`` tries to drain before saving to the spill file.
        commit_wait_s: how long a response may wait for its record to be written
            (:meth:`wait_written`); 0 (default) never waits.
        fail_closed: ``"when_exhausted"`` (refuse once memory and spill are full) or
            ``"at_once"`` (refuse while writes fail); only for ``required`` sinks.
        max_refused: most refusal records (503 ``records_unavailable``) kept beyond the
            buffer while the sink cannot write; more are dropped and counted.
        check_interval_s: while idle, probe a sink that has ``check()`` this often
            (seconds; 0 = never). Each probe is bounded by the same time.
        write_timeout_s: a ``sink.write`` still running after this many seconds makes
            the sink unhealthy (``/health/ready`` 503 for a required sink, refusals
            under ``at_once``) while the write goes on (0 = never). The write is not
            cancelled: a database that hangs rather than refuses may still commit it,
            and a cancelled write retried would be written twice.

    Raises:
        ValueError: an unknown ``fail_closed`` value.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        required: bool = False,
        buffer: int = 10_000,
        batch_size: int = 500,
        linger_s: float = 0.02,
        spill: bool = True,
        spill_path: str | Path | None = None,
        spill_max_bytes: int = 256 * 1024 * 1024,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 5.0,
        retry_after_s: int = 5,
        close_timeout_s: float = 10.0,
        commit_wait_s: float = 0.0,
        fail_closed: str = "when_exhausted",
        max_refused: int = 100_000,
        check_interval_s: float = 10.0,
        write_timeout_s: float = 10.0,
    ) -> None:
        if fail_closed not in FAIL_CLOSED_MODES:
            raise ValueError(
                f"fail_closed must be one of {', '.join(FAIL_CLOSED_MODES)}, not {fail_closed!r}"
            )
        self.sink = sink
        self.name = sink.name
        self.required = required
        self.buffer = max(1, int(buffer))
        self.batch_size = max(1, int(batch_size))
        self.linger_s = float(linger_s)
        self.spill_path: Path | None = (
            Path(spill_path or f"servehall-spill-{sink.name}.jsonl").expanduser() if spill else None
        )
        self.spill_max_bytes = int(spill_max_bytes)
        self.retry_initial_s = float(retry_initial_s)
        self.retry_max_s = float(retry_max_s)
        self.retry_after_s = int(retry_after_s)
        self.close_timeout_s = float(close_timeout_s)
        self.commit_wait_s = float(commit_wait_s)
        if self.commit_wait_s < 0:
            raise ValueError("commit_wait_s must be >= 0")
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self.commit_wait_timeouts = 0
        self.fail_closed = fail_closed
        self.max_refused = max(0, int(max_refused))
        self.check_interval_s = max(0.0, float(check_interval_s))
        self.checks_failed = 0
        self.write_timeout_s = max(0.0, float(write_timeout_s))
        self.write_timeouts = 0
        self._bad = BadRecords(
            sink, quarantine_path(sink.name, self.spill_path), self.write_timeout_s or 10.0
        )
        self._tail_refused = 0

        self.mem: deque[Record] = deque()
        self.tail: deque[Record] = deque()
        self._spill_file = (
            SpillFile(self.spill_path, self.name, self.spill_max_bytes, self._warn)
            if self.spill_path is not None
            else None
        )

        self.written = 0
        self.dropped = 0
        self.failures = 0
        self.audit_failures = 0
        self.healthy = True
        self.last_error: str | None = None
        self._last_warn: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._closed = asyncio.Event()  # set by close(): ends a linger at once
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sink, pick up a spill file left by a previous run, start the task."""
        try:
            await self.sink.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.sink.close()
            raise
        if self._spill_file is not None and self._spill_file.path.exists():
            self._spill_file.adopt()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"servehall-sink-{self.name}"
        )
        if self._spill_active:
            self._wake.set()

    async def close(self) -> None:
        """Drain (up to ``close_timeout_s``), save the rest to the spill file, close."""
        self._closing = True
        self._wake.set()
        self._closed.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.close_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            self._task = None
        self._save_leftovers()
        with contextlib.suppress(Exception):
            await self.sink.close()

    # --- the producer side -------------------------------------------------------------

    @property
    def quarantine_path(self) -> Path:
        """The quarantine file (``servehall-rejected-<sink>.jsonl`` next to the spill file)."""
        return self._bad.path

    @property
    def rejected(self) -> int:
        """Records (and spill-file lines) quarantined."""
        return self._bad.rejected

    @property
    def _spill_active(self) -> bool:
        """Whether the spill file holds records not replayed yet (new ones go there)."""
        return self._spill_file is not None and self._spill_file.active

    def _can_mem(self) -> bool:
        return not self._spill_active and not self.tail and len(self.mem) < self.buffer

    def _can_spill(self) -> bool:
        return self._spill_file is not None and not self.tail and self._spill_file.has_room

    @property
    def exhausted(self) -> bool:
        """True when neither memory nor the spill file can take another record."""
        return not self._can_mem() and not self._can_spill()

    @property
    def refusing(self) -> bool:
        """True while a ``required`` sink makes the host refuse new requests (503)."""
        if not self.required:
            return False
        if self.fail_closed == "at_once" and not self.healthy:
            return True
        return self.exhausted

    @property
    def pending(self) -> int:
        """Records not yet written (memory + tail; spilled records not counted)."""
        return len(self.mem) + len(self.tail)

    def put(self, record: Record) -> None:
        """Queue ``record``. Never blocks, never raises."""
        if self._can_mem():
            self.mem.append(record)
        elif self._can_spill() and self._spill_file is not None and self._spill_file.append(record):
            pass
        elif self.required and not _is_refusal(record):
            self.tail.append(record)  # admitted before the sink failed: never dropped
        elif self.required and self._tail_refused < self.max_refused:
            self._tail_refused += 1
            self.tail.append(record)
        else:
            self.dropped += 1
            self._warn("drop", f"sink {self.name!r}: buffer and spill file full; record dropped")
            return
        self._wake.set()

    def _warn(self, kind: str, msg: str) -> None:
        """Log a warning, at most once per 5 s per ``kind``."""
        now = time.monotonic()
        if now - self._last_warn.get(kind, -1e9) > 5.0:
            self._last_warn[kind] = now
            log.warning(msg)

    def expect(self, record: RequestRecord) -> asyncio.Future[None] | None:
        """A future resolved when ``record`` (already :meth:`put`) has been written; None
        when ``commit_wait_s`` is 0. Register before yielding to the event loop."""
        if self.commit_wait_s <= 0:
            return None
        fut = asyncio.get_running_loop().create_future()
        self._waiters[record.request_id] = fut
        return fut

    async def wait_written(self, record: RequestRecord) -> bool:
        """Wait until ``record`` (already :meth:`put`) is written, at most
        ``commit_wait_s``. Returns True when written, False on timeout (the record stays
        queued: it is written later, or spilled at close) or when waiting is off."""
        return await self.wait(record, self.expect(record))

    async def wait(self, record: RequestRecord, fut: asyncio.Future[None] | None) -> bool:
        """Await a future from :meth:`expect` (see :meth:`wait_written`)."""
        if fut is None:
            return False
        try:
            async with asyncio.timeout(self.commit_wait_s):
                await fut
            return True
        except TimeoutError:
            self.commit_wait_timeouts += 1
            self._warn(
                "commit-wait",
                f"sink {self.name!r}: a record was not written within commit_wait_s "
                f"({self.commit_wait_s:g} s); responding anyway (it stays queued)",
            )
            return False
        finally:
            if self._waiters.get(record.request_id) is fut:
                del self._waiters[record.request_id]

    def _confirm(self, batch: list[Record]) -> None:
        if not self._waiters:
            return
        for rec in batch:
            if isinstance(rec, RequestRecord):
                fut = self._waiters.pop(rec.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

    # --- the consumer side -------------------------------------------------------------

    def _next_batch(self) -> tuple[list[Record], list[int] | None]:
        """The next batch and, when it comes from the spill file, the file offset after
        each of its records."""
        if not self.mem and not self._spill_active and self.tail:
            self.mem, self.tail = self.tail, deque()
            self._tail_refused = 0
        if self.mem:
            return list(islice(self.mem, 0, self.batch_size)), None
        spill = self._spill_file
        if spill is not None and spill.active:
            try:
                records, ends, pos = spill.read(self.batch_size, self._bad.reject_line)
            except OSError as exc:
                log.error("sink %r: cannot read spill file: %s", self.name, exc.strerror)
                records, ends, pos = [], [], spill.read_pos
            if records:
                return records, ends
            if pos != spill.read_pos:  # only unreadable lines were read
                spill.advance(pos)
                return self._next_batch()
            spill.end()
            return self._next_batch()
        return [], None

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        await _wait_set(self._wake, seconds)

    async def _run(self) -> None:
        backoff = self.retry_initial_s
        while True:
            batch, ends = self._next_batch()
            if not batch:
                if self._closing:
                    return
                self._wake.clear()
                await self._idle()
                if self.linger_s > 0 and not self._closing:
                    await self._linger()
                continue
            error: Exception | None = None
            try:
                await self._write(batch)
            except Exception as exc:
                error = exc
            if error is not None and self._bad.suspect(error):
                # maybe one record's content: write them one by one, quarantine the bad
                before = self.rejected
                done, error = await self._write_alone(batch)
                self._advance(batch, done, ends, rejected=self.rejected - before)
            elif error is None:
                self._advance(batch, len(batch), ends)
            if error is not None:
                self.failures += 1
                if any(isinstance(r, AuditEvent) for r in batch):
                    self.audit_failures += 1
                self._unhealthy("write", error)
                await asyncio.sleep(backoff) if not self._closing else await self._sleep(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            self._healthy_again("writing again")
            backoff = self.retry_initial_s
            if self._group_commit(len(batch)):
                await self._linger()

    def _advance(
        self, batch: list[Record], done: int, ends: list[int] | None, *, rejected: int = 0
    ) -> None:
        """The first ``done`` records of ``batch`` are written, or ``rejected`` of them
        quarantined: confirm them and move past them (memory, or the spill file's read
        position)."""
        if done <= 0:
            return
        head = batch[:done]
        self.written += done - rejected
        self._confirm(head)
        if ends is None:
            for _ in range(done):
                self.mem.popleft()
        else:
            assert self._spill_file is not None
            self._spill_file.advance(ends[done - 1])

    # --- bad records: split, probe, quarantine -------------------------------------------

    async def _write_alone(self, batch: list[Record]) -> tuple[int, Exception | None]:
        """Write ``batch`` record by record; a record refused for its content while the
        sink takes a known-good one (:meth:`BadRecords.takes_good_records`) is quarantined.

        Returns how many records, from the first, are done (written or quarantined) and
        the error that stopped it (an outage), or None when all are done.
        """
        for i, rec in enumerate(batch):
            try:
                await self._write([rec])
            except Exception as exc:
                if not self._bad.suspect(exc) or not await self._bad.takes_good_records():
                    return i, exc
                await self._bad.reject(rec, exc)
        return len(batch), None

    async def _write(self, batch: list[Record]) -> None:
        """``sink.write(batch)``; past ``write_timeout_s`` the sink is marked unhealthy
        and the write is awaited on (see the class docstring)."""
        if self.write_timeout_s <= 0:
            await self.sink.write(batch)
            return
        # a timer rather than a task per write (asyncio.wait would wrap the write in one)
        late = asyncio.get_running_loop().call_later(
            self.write_timeout_s, self._write_late, len(batch)
        )
        try:
            await self.sink.write(batch)
        finally:
            late.cancel()

    def _write_late(self, records: int) -> None:
        """A write of ``records`` records is still running after ``write_timeout_s``."""
        self.write_timeouts += 1
        self._unhealthy(
            "write",
            TimeoutError(
                f"write of {records} record(s) still running after "
                f"{self.write_timeout_s:g} s (write_timeout_s); waiting for it"
            ),
        )

    async def _idle(self) -> None:
        """Wait for records; every ``check_interval_s`` meanwhile, probe the sink."""
        check = getattr(self.sink, "check", None)
        if check is None or self.check_interval_s <= 0:
            await self._wake.wait()
            return
        while True:
            if await _wait_set(self._wake, self.check_interval_s):
                return
            try:
                async with asyncio.timeout(self.check_interval_s):
                    await check()
            except Exception as exc:
                self.checks_failed += 1
                self._unhealthy("check", exc)
            else:
                self._healthy_again("check passed, reachable again")

    def _unhealthy(self, what: str, exc: Exception) -> None:
        """A ``write`` or ``check`` failed: not healthy, with ``exc`` as the last error
        (a warning at most every 5 s per kind)."""
        self.healthy = False
        why = str(exc)[:200] or ("timed out" if isinstance(exc, TimeoutError) else "")
        self.last_error = f"{type(exc).__name__}: {why}"
        retrying = ", retrying" if what == "write" else ""
        self._warn(what, f"sink {self.name!r}: {what} failed{retrying}: {self.last_error}")

    def _healthy_again(self, why: str) -> None:
        if not self.healthy:
            log.info("sink %r: %s", self.name, why)
        self.healthy = True

    async def _linger(self) -> None:
        """Wait ``linger_s`` for more records to gather; :meth:`close` ends it at once."""
        await _wait_set(self._closed, self.linger_s)

    def _group_commit(self, written: int) -> bool:
        """Whether to linger after a write of ``written`` records before the next one.

        Under steady load the queue is never empty, so without this each write would
        take only what arrived during the previous one (a few records per transaction).
        Not after a full batch (a backlog: write on), while closing, or when responses
        wait for their records (``commit_wait_s``).
        """
        return (
            self.linger_s > 0
            and written < self.batch_size
            and not self._closing
            and not self.commit_wait_s
        )

    # --- persistence at close / start ----------------------------------------------------

    def _save_leftovers(self) -> None:
        """Write mem + unread spill + tail, in order, to the spill file (atomically)."""
        left = len(self.mem) + len(self.tail)
        if self._spill_file is None:
            if left:
                log.error(
                    "sink %r: %d record(s) could not be written and are lost", self.name, left
                )
            return
        if self._spill_file.save(self.mem, self.tail, left):
            self.mem.clear()
            self.tail.clear()
            self._tail_refused = 0

    def stats(self) -> dict[str, Any]:
        """Counters for health and metrics (records, bytes)."""
        return {
            "sink": self.name,
            "required": self.required,
            "healthy": self.healthy,
            "exhausted": self.exhausted,
            "refusing": self.refusing,
            "queued": self.pending,
            "spilled_bytes": self._spill_file.unread_bytes if self._spill_file else 0,
            "written": self.written,
            "dropped": self.dropped,
            "failures": self.failures,
            "audit_failures": self.audit_failures,
            "checks_failed": self.checks_failed,
            "write_timeouts": self.write_timeouts,
            "rejected": self.rejected,
            "last_error": self.last_error,
        }
