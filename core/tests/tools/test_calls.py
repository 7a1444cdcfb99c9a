"""``servehall.tools.calls``: tool calls and their streamed pieces on the wire, whole
calls assembled from pieces, and pieces merged per event."""

from __future__ import annotations

import re

import pytest

from servehall.tools.calls import (
    ToolCall,
    ToolCallDelta,
    assemble,
    is_json_object,
    merge_deltas,
    new_call_id,
)


def test_call_ids_are_fresh_openai_style() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


def test_the_first_piece_names_the_call_later_ones_carry_arguments() -> None:
    assert ToolCallDelta(0, "", "call_1", "f").wire() == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert ToolCallDelta(1, '{"a"').wire() == {"index": 1, "function": {"arguments": '{"a"'}}


def test_a_whole_call_on_the_wire() -> None:
    assert ToolCall("call_1", "f", '{"x": 1}').wire() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"x": 1}'},
    }


def test_assemble_joins_pieces_in_index_order() -> None:
    pieces = [
        ToolCallDelta(1, "", "b", "g"),
        ToolCallDelta(0, "{", "a", "f"),
        ToolCallDelta(1, "{}"),
        ToolCallDelta(0, '"x": 1'),
        ToolCallDelta(0, "}"),
    ]
    assert assemble(pieces) == [ToolCall("a", "f", '{"x": 1}'), ToolCall("b", "g", "{}")]
    assert assemble([]) == []


def test_arguments_before_the_name_are_refused() -> None:
    with pytest.raises(ValueError, match="tool call 2: arguments before its name"):
        assemble([ToolCallDelta(2, "{")])


def test_merge_joins_adjacent_pieces_of_one_call_only() -> None:
    pieces = [
        ToolCallDelta(0, "", "a", "f"),
        ToolCallDelta(0, "{"),
        ToolCallDelta(0, "}"),
        ToolCallDelta(1, "", "b", "g"),
        ToolCallDelta(1, "["),
        ToolCallDelta(0, " "),  # another call in between: not merged across
    ]
    merged = merge_deltas(pieces)
    assert merged == [
        ToolCallDelta(0, "{}", "a", "f"),
        ToolCallDelta(1, "[", "b", "g"),
        ToolCallDelta(0, " "),
    ]
    assert assemble(merged[:2]) == assemble(pieces[:5])


def test_is_json_object() -> None:
    assert is_json_object('{"a": [1]}')
    assert is_json_object("{}")
    for text in ("[]", "1", '"x"', "{", "", "null"):
        assert not is_json_object(text)
