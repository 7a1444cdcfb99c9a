"""Tool calling: the request's tools and tool choice (:mod:`~servehall.tools.plan`), the
per-model tool-call formats (:mod:`~servehall.tools.parsers`, a registry plugins extend
with ``servehall_register_tool_parsers``), and the streams that turn model output into
OpenAI ``tool_calls`` (:mod:`~servehall.tools.calls`, :mod:`~servehall.tools.scanner`,
:mod:`~servehall.tools.forced`). See docs/api.md, "Tools"."""

from servehall.tools.calls import (
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolOutput,
    assemble,
    new_call_id,
)
from servehall.tools.parsers import HERMES, LLAMA3_JSON, ToolParser
from servehall.tools.plan import FunctionTool, ToolPlan
from servehall.tools.scanner import CallFormat, JsonCallStream

__all__ = [
    "HERMES",
    "LLAMA3_JSON",
    "CallFormat",
    "FunctionTool",
    "JsonCallStream",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolOutput",
    "ToolParser",
    "ToolPlan",
    "assemble",
    "new_call_id",
]
