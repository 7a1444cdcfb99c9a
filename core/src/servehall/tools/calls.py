"""Tool calls as the OpenAI API shows them: whole calls (``message.tool_calls``) and
streamed pieces (``delta.tool_calls``), and the per-choice stream that turns model text
into both.

One :class:`ToolCallStream` per choice is fed the choice's text (after stop strings and
output filters) as it arrives; each :meth:`~ToolCallStream.feed` returns the content
text and the tool-call deltas that text completes. The non-streamed response is the
same stream fed everything at once and assembled with :func:`assemble`, so streamed and
non-streamed tool calls are equal by construction for any split of the text (the test
``core/tests/tools/test_scanner.py`` re-splits recorded outputs at every boundary).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


def new_call_id() -> str:
    """A fresh OpenAI-style tool-call id: ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call ``index`` (0-based within the choice).

    The first piece of a call carries ``id`` and ``name`` (and ``arguments`` ""); later
    pieces carry only ``arguments`` fragments, whose concatenation is the call's
    arguments text.
    """

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def wire(self) -> dict[str, Any]:
        """The OpenAI ``delta.tool_calls[]`` item of this piece."""
        if self.name is not None:
            return {
                "index": self.index,
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole call: ``arguments`` is JSON text (as the model wrote it)."""

    id: str
    name: str
    arguments: str

    def wire(self) -> dict[str, Any]:
        """The OpenAI ``message.tool_calls[]`` item of this call."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class ToolOutput:
    """What one feed of text yields: content text and tool-call pieces."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class ToolCallStream(Protocol):
    """Turns one choice's output text into content and tool calls (see the module
    docstring). ``parsed`` / ``failed`` count the calls whose arguments were / were not a
    JSON object once the stream finished (a started call that never named its function
    is content, and counts as failed)."""

    parsed: int
    failed: int

    def feed(self, text: str) -> ToolOutput:
        """Consume ``text`` (any split of the output); return what it completes."""
        ...

    def finish(self) -> ToolOutput:
        """The output ended: release what was held back and close an open call."""
        ...


def assemble(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """Whole calls from their pieces, in index order (ValueError for a piece of a call
    whose first piece is missing)."""
    calls: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    for d in deltas:
        if d.name is not None:
            heads[d.index] = (d.id or "", d.name)
            calls[d.index] = [d.arguments]
        elif d.index in calls:
            calls[d.index].append(d.arguments)
        else:
            raise ValueError(f"tool call {d.index}: arguments before its name")
    return [ToolCall(heads[i][0], heads[i][1], "".join(calls[i])) for i in sorted(calls)]


def merge_deltas(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Adjacent pieces of one call joined (a name piece absorbs the argument fragments
    after it): fewer, equal pieces for one event."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and d.name is None and out[-1].index == d.index:
            last = out[-1]
            out[-1] = ToolCallDelta(last.index, last.arguments + d.arguments, last.id, last.name)
        else:
            out.append(d)
    return out


def is_json_object(text: str) -> bool:
    """True when ``text`` is one JSON object (a call's arguments must be one)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


IdFactory = Callable[[], str]
