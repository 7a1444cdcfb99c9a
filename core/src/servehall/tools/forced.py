"""The streams of the two forced tool choices, whose output a grammar shapes as JSON
(vLLM's approach, ``vllm/tool_parsers/utils.py::get_json_schema_from_tools``), whatever
the model's own tool-call format:

* a named function (``tool_choice: {"type": "function", "function": {"name": "f"}}``):
  the whole output is the arguments object (:class:`NamedCallStream`);
* ``tool_choice: "required"``: the output is a JSON array of
  ``{"name": ..., "parameters": {...}}`` objects (:data:`REQUIRED_FORMAT`, read by the
  same scanner as the model formats).
"""

from __future__ import annotations

from servehall.tools.calls import (
    IdFactory,
    ToolCallDelta,
    ToolOutput,
    is_json_object,
    new_call_id,
)
from servehall.tools.scanner import CallFormat

REQUIRED_FORMAT = CallFormat("", "", ("parameters",), skip="[,]")
"""``tool_choice: "required"``: a JSON array of ``{"name", "parameters"}`` objects."""


class NamedCallStream:
    """One call to ``name`` whose arguments are the whole output (see the module
    docstring); the first feed sends the call's id and name."""

    def __init__(self, name: str, new_id: IdFactory = new_call_id) -> None:
        self.name = name
        self.new_id = new_id
        self.parsed = 0
        self.failed = 0
        self._started = False
        self._args: list[str] = []

    def _head(self, out: ToolOutput) -> None:
        if not self._started:
            self._started = True
            out.calls.append(ToolCallDelta(0, "", self.new_id(), self.name))

    def feed(self, text: str) -> ToolOutput:
        """See :meth:`servehall.tools.calls.ToolCallStream.feed`."""
        out = ToolOutput()
        self._head(out)
        if text:
            self._args.append(text)
            out.calls.append(ToolCallDelta(0, text))
        return out

    def finish(self) -> ToolOutput:
        """See :meth:`servehall.tools.calls.ToolCallStream.finish`."""
        out = ToolOutput()
        self._head(out)
        if is_json_object("".join(self._args)):
            self.parsed += 1
        else:
            self.failed += 1
        return out
