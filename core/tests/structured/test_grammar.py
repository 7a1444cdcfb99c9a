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


def test_at_most_one_call_under_auto_ends_the_output_after_the_first_call() -> None:
    """``parallel_tool_calls: false`` under ``auto``: free text, one call, then only the
    stop token (xgrammar 0.1.31's TagDispatch with ``loop_after_dispatch=false``);
    with parallel calls allowed, text (and a second call) may follow."""
    xgr = pytest.importorskip("xgrammar")
    tokens = [chr(i) for i in range(32, 127)] + ["\n", "</s>"]
    eos = len(tokens) - 1
    info = xgr.TokenizerInfo(tokens, stop_token_ids=[eos])
    call = 'hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for parallel in (False, True):
        constraint = ToolPlan((WEATHER,), "auto", None, parallel).constraint(HERMES)
        assert constraint is not None
        compiled = xgr.GrammarCompiler(info).compile_grammar(constraint_ebnf(constraint))
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(tokens.index(ch)) for ch in call)
        assert matcher.accept_token(tokens.index("<")) is parallel  # a second call's start
        if not parallel:
            assert matcher.accept_token(eos)


def test_other_structural_tags_are_refused() -> None:
    from servehall.engines.contract import StructuredConstraint

    with pytest.raises(GrammarError, match="triggered_tags"):
        constraint_ebnf(StructuredConstraint(structural_tag='{"type": "structural_tag"}'))
