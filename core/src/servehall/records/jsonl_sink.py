"""The core's ``jsonl`` sink: one JSON object per line, to a file or stdout.

Options: ``path`` — a file (appended to, created with its directory) or ``"-"`` /
``"stdout"`` (the default) for standard output. Lines are the records' JSON form
(:func:`servehall.records.codec.to_json`): ``{"type": "request", ...request_log
columns...}`` or ``{"type": "audit", "at", "actor", "action", "target", "details"}``,
times in ISO-8601 UTC. Prompt text appears only under the same rules as in SQL.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from servehall.records.codec import dumps
from servehall.records.types import Record, check_sink_options

if TYPE_CHECKING:
    from servehall.config.settings import Settings


class JsonlSink:
    """Appends records as JSON lines (see module docstring)."""

    def __init__(self, path: str | Path | None = None, *, name: str = "jsonl") -> None:
        self.name = name
        self.required = False
        self.path = None if path in (None, "-", "stdout") else Path(path).expanduser()
        self._fh: IO[str] | None = None

    async def start(self) -> None:
        """Open the file (append) or bind stdout."""
        if self.path is None:
            self._fh = sys.stdout
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def _write(self, text: str) -> None:
        assert self._fh is not None
        self._fh.write(text)
        self._fh.flush()

    async def write(self, records: Sequence[Record]) -> None:
        """Append one line per record (one write + flush per batch, off the event loop)."""
        text = "".join(dumps(r) + "\n" for r in records)
        await asyncio.to_thread(self._write, text)

    async def close(self) -> None:
        """Close the file (stdout is left open). Idempotent."""
        if self._fh is not None and self._fh is not sys.stdout:
            self._fh.close()
        self._fh = None


def jsonl_sink_factory(options: dict[str, Any], settings: Settings) -> JsonlSink:
    """``SinkSpec`` factory for ``jsonl``: option ``path`` (file, or ``-`` for stdout).

    Raises:
        ConfigError: an unknown option.
    """
    check_sink_options("jsonl", options, ("path",))
    return JsonlSink(options.get("path"))
