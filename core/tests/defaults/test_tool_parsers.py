"""Tests of servehall.defaults.tool_parsers: the built-in tool-call parsers registered."""

from __future__ import annotations

import pytest

from servehall.defaults.tool_parsers import servehall_register_tool_parsers
from servehall.plugin.registries import ToolParserRegistry
from servehall.tools.parsers import HERMES, LLAMA3_JSON


def test_hermes_and_llama3_json_are_registered() -> None:
    reg = ToolParserRegistry()
    servehall_register_tool_parsers(reg)
    assert reg.names() == ["hermes", "llama3_json"]
    assert reg.get("hermes") is HERMES and reg.get("llama3_json") is LLAMA3_JSON
    assert HERMES.trigger == "<tool_call>" and LLAMA3_JSON.trigger.startswith('{"name"')


def test_registering_twice_is_refused() -> None:
    from servehall import ConfigError

    reg = ToolParserRegistry()
    servehall_register_tool_parsers(reg)
    with pytest.raises(ConfigError):
        servehall_register_tool_parsers(reg)
