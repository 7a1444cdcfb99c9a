"""The batch runner: one task per serve process (``[batches] enabled``), started and
stopped with the server.

Every ``[batches] poll_s`` seconds it looks for an open batch (one read; nothing more
when there is none) and then moves ``validating`` batches to ``in_progress``, expires the
unrun lines of batches past their completion window, finalizes batches with no line left
(writing the output and error files, :mod:`servehall.batches.lines`), and — while no
model's scheduler queue has a waiting request — claims lines up to ``[batches]
max_concurrent_lines`` being sent (:mod:`servehall.batches.store`). It claims up to as
many again ahead of need: a claimed line waits for one of the ``max_concurrent_lines``
send slots (first come, first served), so when a line's answer comes back the next one
is sent at once, without a database round trip between them; the wake when a line ends
then only claims to refill (no upkeep), and the line's result is written after its slot
is free.

Idle capacity only (``[batches] preempt``, the default): an online request that asks for
a slot (:class:`~servehall.admission.demand.OnlineDemand`) makes the runner stop every
line it is running at once — the request is cancelled, the engine drops it at its next
step, it is recorded 499 ``preempted`` and the line goes back to ``pending`` to run again
from its prompt — and no line is claimed while online requests are in flight or for
``online_quiet_s`` after the last one.

Each line is sent to the app's own ASGI stack, exactly as the same body sent online by
the batch's owner: the auth middleware takes the owner's stored principal from the
:class:`~servehall.batches.call.BatchCall` in the scope (only this process can put it
there), so the owner's scopes, model list, quotas and filters apply; the endpoint runs
the line at the batch priority and records it with the batch id and ``custom_id``. A
429 or 503 answer (quota, full queue) is not a result: the line goes back to
``pending`` and the runner pauses for the ``Retry-After`` seconds (1–30).

The runner never creates the records database: while ``[database] url`` is a SQLite
file that does not exist, it waits; a database that is down or not migrated is logged
once and tried again every :data:`RETRY_S` seconds.

While a line runs, its claim is renewed every ``lease_s / 3``; on shutdown the lines in
flight get a few seconds to finish, the rest are cancelled and given back
(``pending``), so a restart (or another replica) runs them; a runner that dies
without giving them back loses them after ``lease_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message

from servehall.batches.call import SCOPE_KEY, BatchCall
from servehall.batches.lines import response_line, unrun_line
from servehall.batches.principals import principal_from_json, tenant_of
from servehall.batches.store import BatchStore, Claimed
from servehall.errors import ServehallError
from servehall.records.types import AuditEvent

if TYPE_CHECKING:
    from servehall.files.service import FileService
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host

log = logging.getLogger("servehall.batches")

RETRY_STATUSES = (429, 503)
"""Answers that mean "not now": the line is given back and retried."""
METRICS_EVERY_S = 5.0
"""How often the queued-lines gauge is read from the database."""
RETRY_S = 30.0
"""Seconds between tries while the records database is down or not migrated."""


def _now() -> datetime:
    return datetime.now(UTC)


class BatchRunner:
    """See the module docstring. ``app`` is the server's ASGI app, ``files`` its
    :class:`~servehall.files.service.FileService` (the database engine and the store of
    the result files)."""

    def __init__(
        self, app: ASGIApp, host: Host, files: FileService, metrics: Metrics | None = None
    ) -> None:
        self.app = app
        self.host = host
        self.files = files
        self.metrics = metrics
        self.settings = host.settings.batches
        self.name = f"{host.replica[:100]}:{uuid.uuid4().hex[:12]}"
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[int, tuple[Claimed, asyncio.Task[None]]] = {}
        self._calls: dict[int, BatchCall] = {}  # line seq -> its call, while it is sent
        # lines being sent hold a slot; claimed lines wait for one (FIFO)
        self._slots: asyncio.Semaphore | None = None
        self._sending = 0
        self._stopping = False
        self._owners: dict[str, tuple[Any, str]] = {}
        self._tenants: dict[int, str] = {}  # line seq -> its tenant, while in flight
        self._line_ended = asyncio.Event()  # wakes the loop before its next poll
        self._paused_until = 0.0
        self._renewed = 0.0
        self._housekept = -float("inf")
        self._metrics_at = 0.0
        self._store: BatchStore | None = None

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop (nothing when ``[batches] enabled`` is false)."""
        if self.settings.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
            self.host.online.listeners.append(self._on_online)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop claiming; let the lines in flight finish for up to ``grace_s`` seconds,
        then cancel the rest and give them back (each leaves a 499 request record and
        runs again later)."""
        task, self._task = self._task, None
        self._stopping = True  # a claimed line that gets a slot now is given back
        with contextlib.suppress(ValueError):
            self.host.online.listeners.remove(self._on_online)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        running = [t for _, t in self._inflight.values()]
        if running:
            await asyncio.wait(running, timeout=grace_s)
        for t in running:
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _loop(self) -> None:
        warned = False
        while not self._stopping:
            try:
                mono = time.monotonic()
                # claims on every wake; the batch-wide upkeep at most once per poll
                await self.tick(housekeep=mono - self._housekept >= self.settings.poll_s)
                delay = self.settings.poll_s
                warned = False
            except (SQLAlchemyError, ServehallError, OSError) as exc:
                # once per outage: a database that is down or not migrated is retried
                # quietly (a server without batches need not have one)
                if not warned:
                    log.warning(
                        "batch runner: %s (retrying every %g s)",
                        getattr(exc, "message", None) or exc,
                        RETRY_S,
                    )
                warned = True
                delay = RETRY_S
            except Exception:
                log.exception("batch runner: unexpected error")
                delay = RETRY_S
            if delay == RETRY_S:
                await asyncio.sleep(delay)
                continue
            if self.settings.preempt and (self._inflight or self.host.online.inflight):
                # wake when the quiet time after online traffic is over, not a poll later
                rest = self.settings.online_quiet_s - self.host.online.quiet_for()
                if 0 < rest < delay:
                    delay = rest
            # the next pass at poll_s, or as soon as a line ends (its slot is free now);
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel that
            # comes as the event is set, and stop() would wait for the loop forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._line_ended.wait()
            self._line_ended.clear()

    async def _get_store(self) -> BatchStore | None:
        """The store, or None while the records database is a SQLite file that does
        not exist yet (no batch can exist; the runner does not create the file)."""
        if self._store is None:
            from servehall.db.engine import database_url
            from servehall.db.locate import sqlite_path

            path = sqlite_path(database_url(self.host.settings))
            if path is not None and not path.exists():
                return None
            self._store = BatchStore((await self.files.catalog()).engine)
        return self._store

    # --- one pass ---------------------------------------------------------------------

    def online_waiting(self) -> bool:
        """True when any model's scheduler queue has a waiting request."""
        for served in list(self.host.models.values()):
            scheduler = getattr(served, "scheduler", None)
            if scheduler is not None and getattr(scheduler, "waiting", 0) > 0:
                return True
        return False

    def may_claim(self) -> bool:
        """Whether new lines may be claimed now: no online request waits in a queue and,
        with ``preempt``, none is in flight and the last ended ``online_quiet_s`` ago."""
        if self.online_waiting():
            return False
        if self.settings.preempt:
            return self.host.online.quiet_for() >= self.settings.online_quiet_s
        return True

    def _on_online(self) -> None:
        if self.settings.preempt:
            self.preempt()

    def preempt(self) -> int:
        """Stop every line being sent now (see the module docstring); how many."""
        stopped = 0
        for seq, call in list(self._calls.items()):
            got = self._inflight.get(seq)
            if got is None or got[1].done():
                continue
            call.preempted = True
            got[1].cancel()
            stopped += 1
        self._calls.clear()
        if stopped and self.metrics is not None:
            self.metrics.batch_lines_preempted.inc(stopped)
        return stopped

    async def tick(self, housekeep: bool = True) -> None:
        """One pass (see the module docstring).

        ``housekeep=False`` (the loop's wake when a line ended, less than ``poll_s``
        after the last full pass) only claims lines: starting validated batches,
        expiring, renewing claims and finalizing wait for the next full pass, so a
        stream of short lines costs one claim per line, not four database round trips
        (three of them write transactions)."""
        store = await self._get_store()
        if store is None:
            return
        lease = self.settings.lease_s
        now = _now()
        if not self._inflight and not await store.any_open():
            self._report(0)
            return  # nothing to do: one read, no write lock taken
        mono = time.monotonic()
        if housekeep:
            self._housekept = mono
            await store.start_validated(now)
            await store.expire_due(now, lease)
            if self._inflight and mono - self._renewed >= lease / 3:
                await store.renew(self.name, list(self._inflight), now)
                self._renewed = mono
            for batch_id in await store.finalizable(now, lease):
                await self._finalize(store, batch_id)
        # max_concurrent_lines being sent, as many again claimed ahead (waiting for a
        # slot, or writing their results)
        room = 2 * self.settings.max_concurrent_lines - len(self._inflight)
        if room > 0 and mono >= self._paused_until and self.may_claim():
            claimed = await store.claim(self.name, room, now, lease, self._full_batches())
            for batch_id in dict.fromkeys(line.batch_id for line in claimed):
                # owners read before the tasks start, so the lines reach the send slots
                # in claim order (a task that finds no owner handles it itself)
                with contextlib.suppress(Exception):
                    await self._owner(store, batch_id)
            for line in claimed:
                task = asyncio.get_running_loop().create_task(self._run(store, line))
                self._inflight[line.seq] = (line, task)
                if not self._renewed:
                    self._renewed = mono
        queued = None
        if self.metrics is not None and mono - self._metrics_at >= METRICS_EVERY_S:
            self._metrics_at = mono
            queued = (await store.line_totals()).get("pending", 0)
        self._report(queued)

    def _full_batches(self) -> list[str]:
        """Known batches whose tenant has ``max_lines_per_tenant`` lines in flight here
        (the claim skips them)."""
        cap = self.settings.max_lines_per_tenant
        if cap is None or not self._tenants:
            return []
        busy = Counter(self._tenants.values())
        return [b for b, (p, _) in self._owners.items() if busy[tenant_of(p)] >= cap]

    def _take_tenant_slot(self, seq: int, principal: Any) -> bool:
        """Count line ``seq`` against its tenant's cap; False when the cap is full (a
        line of a batch claimed before its tenant was known: it is given back)."""
        tenant = tenant_of(principal)
        cap = self.settings.max_lines_per_tenant
        if cap is not None and sum(1 for t in self._tenants.values() if t == tenant) >= cap:
            return False
        self._tenants[seq] = tenant
        return True

    def _report(self, queued: int | None) -> None:
        """Set the gauges: lines in flight, and ``queued`` when it was read."""
        if self.metrics is not None:
            self.metrics.batch_lines_running.set(self._sending)
            if queued is not None:
                self.metrics.batch_lines_queued.set(queued)

    async def _owner(self, store: BatchStore, batch_id: str) -> tuple[Any, str]:
        got = self._owners.get(batch_id)
        if got is None:
            if len(self._owners) >= 1024:  # batches other replicas finalized
                self._owners.clear()
            batch = await store.get(batch_id, None)
            if batch is None:
                raise LookupError(batch_id)
            got = self._owners[batch_id] = (principal_from_json(batch.principal), batch.endpoint)
        return got

    async def _run(self, store: BatchStore, line: Claimed) -> None:
        stored = False
        try:
            principal, endpoint = await self._owner(store, line.batch_id)
            if not self._take_tenant_slot(line.seq, principal):
                return  # given back below; the next claims skip this batch
            body: Any = json.loads(line.body)
            if isinstance(body, dict) and body.get("stream"):
                result = unrun_line(
                    line.custom_id,
                    "invalid_request",
                    "'stream' is not supported in a batch request; the output file holds "
                    "whole responses.",
                )
                stored = await store.finish(
                    line,
                    self.name,
                    ok=False,
                    status_code=None,
                    request_id=None,
                    result=result,
                    now=_now(),
                )
                self._count(stored, "failed")
                return
            call = BatchCall(
                principal=principal,
                batch_id=line.batch_id,
                custom_id=line.custom_id,
                priority=self.settings.priority,
            )
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.settings.max_concurrent_lines)
            async with self._slots:
                if self._stopping or (self.settings.preempt and not self.may_claim()):
                    return  # stopping, or online traffic came while it waited: given back
                self._calls[line.seq] = call
                self._sending += 1
                try:
                    status, headers, raw = await self.send(
                        endpoint, line.body.encode("utf-8"), call
                    )
                finally:
                    self._sending -= 1
                    self._calls.pop(line.seq, None)
            # the slot went to the next claimed line; wake the loop to claim one more
            self._line_ended.set()
            if status in RETRY_STATUSES:
                self._pause(headers.get("retry-after"))
                return
            try:
                answer: Any = json.loads(raw)
            except ValueError:
                answer = raw.decode("utf-8", "replace")
            ok = 200 <= status < 300
            result = response_line(line.custom_id, status, headers.get("x-request-id"), answer)
            stored = await store.finish(
                line,
                self.name,
                ok=ok,
                status_code=status,
                request_id=headers.get("x-request-id"),
                result=result,
                now=_now(),
            )
            self._count(stored, "completed" if ok else "failed")
            if not stored:
                log.warning(
                    "batch %s line %s: the claim lapsed before its result was stored; "
                    "another runner runs it",
                    line.batch_id,
                    line.custom_id,
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s line %s failed to run", line.batch_id, line.custom_id)
            self._pause("2")
        finally:
            self._inflight.pop(line.seq, None)
            self._calls.pop(line.seq, None)
            self._tenants.pop(line.seq, None)
            self._line_ended.set()
            if not stored:
                with contextlib.suppress(Exception):
                    await asyncio.shield(store.release(line, self.name))

    def _count(self, stored: bool, outcome: str) -> None:
        if stored and self.metrics is not None:
            self.metrics.batch_lines_finished.labels(outcome).inc()

    def _pause(self, retry_after: str | None) -> None:
        try:
            seconds = float(retry_after) if retry_after else 1.0
        except ValueError:
            seconds = 1.0
        self._paused_until = max(
            self._paused_until, time.monotonic() + min(max(seconds, 1.0), 30.0)
        )

    async def send(
        self, path: str, body: bytes, call: BatchCall
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``body`` to ``path`` through the app, carrying ``call``; the status,
        headers (lower-case names) and body of the answer."""
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("ascii"),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
            ],
            "client": None,
            "server": None,
            "state": {},
            SCOPE_KEY: call,
        }
        delivered = False
        status = 0
        headers: dict[str, str] = {}
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the "client" stays until the app is done
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for k, v in message.get("headers", ()):
                    headers[k.decode("latin-1").lower()] = v.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, headers, b"".join(chunks)

    # --- finalizing -------------------------------------------------------------------

    async def _finalize(self, store: BatchStore, batch_id: str) -> None:
        now = _now()
        got = await store.claim_finalize(batch_id, self.name, now, self.settings.lease_s)
        if got is None:
            return
        batch, final = got
        out, err = await store.results(batch_id)
        output_id = error_id = None
        if out:
            row = await self.files.add_bytes(
                batch.owner, f"{batch_id}_output.jsonl", "batch_output", _jsonl(out)
            )
            output_id = row.id
        if err:
            row = await self.files.add_bytes(
                batch.owner, f"{batch_id}_error.jsonl", "batch_output", _jsonl(err)
            )
            error_id = row.id
        if not await store.close(batch_id, self.name, final, output_id, error_id, _now()):
            log.warning("batch %s: lost the finalizing claim; another runner ends it", batch_id)
            return
        self._owners.pop(batch_id, None)
        log.info("batch %s %s (%d output, %d error lines)", batch_id, final, len(out), len(err))
        if final == "expired" and self.host.records is not None:
            self.host.records.audit(
                AuditEvent(
                    action="batch.expired",
                    actor="system",
                    target=batch_id,
                    details={"owner": batch.owner, "request_counts": batch.counts},
                )
            )


def _jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")
