"""Bad records: a record that one sink cannot write for its content while it writes
others (see :mod:`servehall.records.runner`, which writes a failed batch record by record
to find it) is told from an outage and quarantined, so it never blocks the records
behind it.

A write error is suspect when the sink's ``suspect(exc)`` says it may come from a
record's content (for sinks without it: ``ValueError``/``TypeError``); a suspect record
is bad only while the sink takes a known-good one (its ``probe()``, else its
``check()``). A bad record goes to the sink's ``quarantine(record, error)`` (the ``sql``
sink: the ``record_rejected`` table), else to the quarantine file, as does an unreadable
spill-file line (:mod:`servehall.records.quarantine`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from servehall.records.quarantine import quarantine_line, request_id_of
from servehall.records.rows import record_kind
from servehall.records.types import Record, Sink

log = logging.getLogger("servehall.records")


class BadRecords:
    """The bad records of ``sink``: judged, probed for and quarantined (``path``: the
    quarantine file); ``wait_s`` bounds a probe and a ``quarantine`` call."""

    def __init__(self, sink: Sink, path: Path, wait_s: float) -> None:
        self.sink = sink
        self.name = sink.name
        self.path = path
        self.wait_s = wait_s
        self.rejected = 0
        """Records (and spill-file lines) quarantined."""

    def suspect(self, exc: Exception) -> bool:
        """Whether ``exc`` may come from a record's content (the sink's ``suspect(exc)``;
        for sinks without one, ``ValueError``/``TypeError``)."""
        judge = getattr(self.sink, "suspect", None)
        if judge is not None:
            try:
                return bool(judge(exc))
            except Exception:
                return False
        return isinstance(exc, ValueError | TypeError)

    async def takes_good_records(self) -> bool:
        """Whether the sink can write right now: its ``probe()`` (a known-good record,
        not kept), else its ``check()``, passes within ``wait_s``.
        A sink with neither is taken at its word."""
        probe = getattr(self.sink, "probe", None) or getattr(self.sink, "check", None)
        if probe is None:
            return True
        try:
            async with asyncio.timeout(self.wait_s):
                await probe()
        except Exception as exc:
            log.warning(
                "sink %r: a record was refused and a known-good one cannot be written "
                "either (%s): an outage, not a bad record; retrying",
                self.name,
                type(exc).__name__,
            )
            return False
        return True

    async def reject(self, record: Record, exc: Exception) -> None:
        """Quarantine ``record`` (refused with ``exc``): the sink's ``quarantine(record,
        error)`` (e.g. the ``record_rejected`` table), else the quarantine file."""
        self.rejected += 1
        error = f"{type(exc).__name__}: {str(exc).strip()}"
        rid = request_id_of(record) or "-"
        keep = getattr(self.sink, "quarantine", None)
        if keep is not None:
            try:
                async with asyncio.timeout(self.wait_s):
                    await keep(record, error)
            except Exception as why:
                log.warning(
                    "sink %r: cannot keep a rejected record in the database (%s); "
                    "using the quarantine file",
                    self.name,
                    type(why).__name__,
                )
            else:
                log.error(
                    "sink %r: %s record of request %s rejected and quarantined in "
                    "record_rejected: %s",
                    self.name,
                    record_kind(record),
                    rid,
                    error[:300],
                )
                return
        where = self._to_file(quarantine_line(self.name, record, error))
        log.error(
            "sink %r: %s record of request %s rejected and quarantined in %s: %s",
            self.name,
            record_kind(record),
            rid,
            where,
            error[:300],
        )

    def reject_line(self, line: str, exc: Exception) -> None:
        """Quarantine an unreadable spill-file line (kind ``line``)."""
        self.rejected += 1
        error = f"unreadable spill-file line: {type(exc).__name__}: {exc}"
        where = self._to_file(quarantine_line(self.name, None, error, raw=line))
        log.error(
            "sink %r: skipped an unreadable spill-file line; quarantined in %s", self.name, where
        )

    def _to_file(self, line: str) -> str:
        """Append ``line`` to the quarantine file; where it went (the path, or "the log"
        with the line itself when the file cannot be written)."""
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            log.error(
                "sink %r: cannot write the quarantine file %s (%s); the record: %s",
                self.name,
                path,
                exc.strerror,
                line,
            )
            return "the log"
        return str(path)
