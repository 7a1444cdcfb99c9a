"""Tool parsers: one per tool-call format a model family writes, chosen per model
(``[[models]] tool_parser``), in a registry plugins extend
(``servehall_register_tool_parsers``; after vLLM's ``vllm/tool_parsers/``, one format per
parser).

A parser makes the per-choice :class:`~servehall.tools.calls.ToolCallStream` for
``tool_choice: "auto"`` and describes its format to the grammar layer: the trigger and the
text around one call, from which :mod:`servehall.tools.plan` builds a structural tag
(OpenVINO Model Server's Hermes 3 guided tool calls are the same idea) when ``auto`` must
be constrained (``strict`` tools, ``parallel_tool_calls: false``).

The core registers:

* ``hermes`` — ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, anywhere in the
  output (Hermes 2/3, Qwen 2.5/3 and the demo model's template);
* ``llama3_json`` — Llama 3.1+ JSON calls: the output starts with
  ``{"name": "f", "parameters": {...}}`` (several separated by ``;``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from servehall.tools.calls import IdFactory, ToolCallStream, new_call_id
from servehall.tools.scanner import CallFormat, JsonCallStream


@dataclass(frozen=True, slots=True)
class ToolParser:
    """A tool-call format (see the module docstring).

    Attributes:
        name: the registry name (``[[models]] tool_parser``).
        format: where calls sit in the output and which key holds the arguments.
        trigger: the text that starts a call, for a structural tag (``"<tool_call>"``).
        begin: the text of a call before its arguments, ``{name}`` standing for the
            function's name as a JSON string.
        end: the text of a call after its arguments.
    """

    name: str
    format: CallFormat
    trigger: str
    begin: str
    end: str

    def stream(self, new_id: IdFactory = new_call_id) -> ToolCallStream:
        """A fresh per-choice stream for ``tool_choice: "auto"``."""
        return JsonCallStream(self.format, new_id)

    def call_begin(self, name: str) -> str:
        """The text before the arguments of a call to ``name``."""
        return self.begin.replace("{name}", json.dumps(name, ensure_ascii=False))


HERMES = ToolParser(
    name="hermes",
    format=CallFormat("<tool_call>", "</tool_call>", ("arguments",)),
    trigger="<tool_call>",
    begin='<tool_call>\n{"name": {name}, "arguments": ',
    end="}\n</tool_call>",
)
"""Hermes format (NousResearch Hermes 2 Pro/3, Qwen 2.5/3)."""

LLAMA3_JSON = ToolParser(
    name="llama3_json",
    format=CallFormat("", "", ("parameters", "arguments"), skip=";"),
    trigger='{"name": ',
    begin='{"name": {name}, "parameters": ',
    end="}",
)
"""Llama 3.1+ JSON tool calls (the ``<|python_tag|>`` special token, when the model
writes it, is not in the detokenized text)."""


def guess_parser_name(chat_template: str | None) -> str:
    """The parser a chat template's format suggests: ``llama3_json`` for a Llama 3
    template with tool calls (``<|python_tag|>`` or ``"parameters"``), else ``hermes``."""
    t = chat_template or ""
    if "<|python_tag|>" in t or ("<|eom_id|>" in t and "parameters" in t):
        return LLAMA3_JSON.name
    return HERMES.name
