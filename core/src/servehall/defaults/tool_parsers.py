"""Default plugin: the built-in tool-call parsers (``hermes``, ``llama3_json``)."""

from __future__ import annotations

from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.registries import ToolParserRegistry
from servehall.tools.parsers import HERMES, LLAMA3_JSON


@hookimpl
def servehall_register_tool_parsers(registry: ToolParserRegistry) -> None:
    registry.add(HERMES)
    registry.add(LLAMA3_JSON)
