"""One sink's spill file: the records its runner could not keep in memory, appended in
order as JSON lines and replayed from a read position (:mod:`servehall.records.runner`).

The file holds ``bytes`` bytes, of which those from ``read_pos`` on are not replayed yet.
After each replayed batch the read position is saved next to the file (``<path>.pos``:
the file's inode and the offset), so a replay cut off by a crash resumes where it was:
a restart writes nothing twice. At close, whatever the runner could not write is saved
to the file (atomically, in order) and replayed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from servehall.records.codec import dumps, from_json
from servehall.records.types import Record

log = logging.getLogger("servehall.records")


class SpillFile:
    """The spill file ``path`` of sink ``sink`` (at most ``max_bytes`` unreplayed bytes).

    ``warn(kind, message)`` logs a rate-limited warning (the runner's). Nothing is
    opened until the first :meth:`append` or :meth:`adopt`.
    """

    def __init__(
        self, path: Path, sink: str, max_bytes: int, warn: Callable[[str, str], None]
    ) -> None:
        self.path = path
        self.sink = sink
        self.max_bytes = int(max_bytes)
        self.pos_path = path.with_name(path.name + ".pos")
        self._warn = warn
        self._fh: IO[str] | None = None
        self.active = False
        """True while the file holds records not replayed yet (new records go there)."""
        self.bytes = 0
        self.read_pos = 0
        self.broken = False
        """True once a write failed: the file takes no more records."""

    @property
    def has_room(self) -> bool:
        """Whether the file can take another record (not broken, under ``max_bytes``)."""
        return not self.broken and self.bytes - self.read_pos < self.max_bytes

    @property
    def unread_bytes(self) -> int:
        """Bytes not replayed yet (0 when the file is not in use)."""
        return self.bytes - self.read_pos if self.active else 0

    def append(self, record: Record) -> bool:
        """Append ``record``; False (and the file broken) when it cannot be written."""
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("a", encoding="utf-8")
                if not self.active:
                    self.read_pos = self.bytes = self._fh.tell()
            line = dumps(record) + "\n"
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:
            self.broken = True
            self._warn(
                "spill-error", f"sink {self.sink!r}: cannot write spill file: {exc.strerror}"
            )
            return False
        if not self.active:
            self.active = True
            self._warn("spill", f"sink {self.sink!r}: buffer full; spilling to {self.path}")
        self.bytes += len(line.encode("utf-8"))
        return True

    def read(
        self, count: int, bad_line: Callable[[str, Exception], None]
    ) -> tuple[list[Record], list[int], int]:
        """Up to ``count`` records from the read position: the records, the file offset
        after each, and the offset after the last line read (an unreadable line is handed
        to ``bad_line`` and skipped)."""
        records: list[Record] = []
        ends: list[int] = []
        with self.path.open("r", encoding="utf-8", errors="surrogateescape") as fh:
            fh.seek(self.read_pos)
            pos = self.read_pos
            while len(records) < count:
                line = fh.readline()
                if not line.endswith("\n"):
                    break
                pos = fh.tell()
                try:
                    records.append(from_json(json.loads(line)))
                except (ValueError, KeyError, TypeError) as exc:
                    bad_line(line, exc)
                else:
                    ends.append(pos)
        return records, ends, pos

    def advance(self, pos: int) -> None:
        """Everything before ``pos`` is replayed: move the read position, save it."""
        self.read_pos = pos
        self.save_pos()

    def end(self) -> None:
        """The file is fully replayed: remove it (the runner buffers in memory again)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.drop_pos()
        self.active = False
        self.bytes = 0
        self.read_pos = 0
        log.info("sink %r: spill file replayed", self.sink)

    def save(self, head: Iterable[Record], tail: Iterable[Record], left: int) -> bool:
        """At close: write ``head`` (memory), the unread part of the file and ``tail``, in
        order, to the file (atomically); ``left`` is how many records ``head`` and
        ``tail`` hold. True when the file was written (False: nothing to save, or an
        error, logged)."""
        unread = b""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.active and self.path.exists():
            with self.path.open("rb") as fh:
                fh.seek(self.read_pos)
                unread = fh.read()
        if not left and not unread:
            if self.active:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                self.drop_pos()
            return False
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("wb") as fh:
                fh.write("".join(dumps(r) + "\n" for r in head).encode("utf-8"))
                fh.write(unread)
                fh.write("".join(dumps(r) + "\n" for r in tail).encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self.drop_pos()  # the file now starts with its first unread record
        except OSError as exc:
            log.error("sink %r: cannot save %d record(s): %s", self.sink, left, exc.strerror)
            return False
        log.warning(
            "sink %r: %d record(s) saved to %s; replayed at the next start",
            self.sink,
            left,
            self.path,
        )
        return True

    def adopt(self) -> None:
        """At start: take up the file a previous run left (a torn last line dropped),
        resuming at its saved read position."""
        size = self.path.stat().st_size
        if size == 0:
            self.path.unlink()
            self.drop_pos()
            return
        with self.path.open("rb+") as fh:  # drop a torn last line
            data = fh.read()
            end = data.rfind(b"\n") + 1
            if end != len(data):
                fh.truncate(end)
        self.active = True
        self.bytes = end
        self.read_pos = self.load_pos(end)
        if self.read_pos:
            log.info(
                "sink %r: resuming the replay of %s at byte %d (replayed before a restart)",
                self.sink,
                self.path,
                self.read_pos,
            )
        else:
            log.info("sink %r: replaying %s from a previous run", self.sink, self.path)

    def save_pos(self) -> None:
        """Save the read position (``<path>.pos``) so that a restart resumes there."""
        try:
            ino = self.path.stat().st_ino
            tmp = self.pos_path.with_name(self.pos_path.name + ".tmp")
            tmp.write_text(json.dumps({"ino": ino, "pos": self.read_pos}))
            os.replace(tmp, self.pos_path)
        except OSError as exc:
            self._warn("pos", f"sink {self.sink!r}: cannot save the replay position: {exc}")

    def load_pos(self, end: int) -> int:
        """The saved read position (0 when none, stale or past ``end``)."""
        try:
            saved = json.loads(self.pos_path.read_text())
            ino, pos = int(saved["ino"]), int(saved["pos"])
            if ino == self.path.stat().st_ino and 0 <= pos <= end:
                return pos
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return 0

    def drop_pos(self) -> None:
        """Remove the saved read position."""
        with contextlib.suppress(OSError):
            self.pos_path.unlink()
