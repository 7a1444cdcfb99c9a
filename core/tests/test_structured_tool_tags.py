"""A tool plan's structural tag (``tool_choice: "auto"`` with ``strict`` tools) compiles
with the xgrammar line OpenVINO GenAI bundles; what that line cannot express is refused,
never weakened."""

from __future__ import annotations

import pytest

from servehall.structured.grammar import GrammarError, constraint_ebnf
from servehall.tools.parsers import HERMES
from servehall.tools.plan import FunctionTool, ToolPlan

WEATHER = FunctionTool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    strict=True,
)


def test_strict_auto_tools_compile_to_a_triggered_grammar() -> None:
    constraint = ToolPlan((WEATHER,), "auto", None, True).constraint(HERMES)
    assert constraint is not None and constraint.structural_tag is not None
    ebnf = constraint_ebnf(constraint)
    assert "get_weather" in ebnf  # the call's begin tag is in the grammar
    assert "city" in ebnf  # and so is its arguments' schema


def test_at_most_one_call_under_auto_is_refused_not_weakened() -> None:
    constraint = ToolPlan((WEATHER,), "auto", None, False).constraint(HERMES)
    assert constraint is not None
    with pytest.raises(GrammarError, match="parallel_tool_calls"):
        constraint_ebnf(constraint)


def test_other_structural_tags_are_refused() -> None:
    from servehall.engines.contract import StructuredConstraint

    with pytest.raises(GrammarError, match="triggered_tags"):
        constraint_ebnf(StructuredConstraint(structural_tag='{"type": "structural_tag"}'))
