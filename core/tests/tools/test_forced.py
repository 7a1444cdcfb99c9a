"""``servehall.tools.forced``: the named-function stream (the whole output is the
arguments) and the ``tool_choice: "required"`` format (a JSON array of calls)."""

from __future__ import annotations

from servehall.tools.calls import ToolCallDelta, assemble
from servehall.tools.forced import REQUIRED_FORMAT, NamedCallStream
from servehall.tools.scanner import JsonCallStream


def _ids() -> str:
    return "call_1"


def test_named_stream_sends_head_once_then_fragments() -> None:
    s = NamedCallStream("f", _ids)
    first = s.feed('{"a"')
    assert first.content == ""
    assert first.calls == [ToolCallDelta(0, "", "call_1", "f"), ToolCallDelta(0, '{"a"')]
    second = s.feed(": 1}")
    assert second.calls == [ToolCallDelta(0, ": 1}")]
    assert s.feed("").calls == []
    assert s.finish().calls == []
    assert (s.parsed, s.failed) == (1, 0)
    calls = assemble(first.calls + second.calls)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_1", "f", '{"a": 1}')]


def test_named_stream_empty_output_still_names_the_call_and_fails() -> None:
    s = NamedCallStream("f", _ids)
    out = s.finish()
    assert out.calls == [ToolCallDelta(0, "", "call_1", "f")]
    assert (s.parsed, s.failed) == (0, 1)


def test_named_stream_counts_non_object_as_failed() -> None:
    for text in ('{"a": ', "[1, 2]", "hello"):
        s = NamedCallStream("f", _ids)
        s.feed(text)
        s.finish()
        assert (s.parsed, s.failed) == (0, 1), text


def test_named_stream_fresh_ids_by_default() -> None:
    a = NamedCallStream("f").feed("{}").calls[0].id
    b = NamedCallStream("f").feed("{}").calls[0].id
    assert a and b and a != b and a.startswith("call_")


def test_required_format_reads_an_array_of_calls() -> None:
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    for split in (len(text), 1, 7):
        s = JsonCallStream(REQUIRED_FORMAT, _ids)
        deltas: list[ToolCallDelta] = []
        content = ""
        for i in range(0, len(text), split):
            out = s.feed(text[i : i + split])
            deltas += out.calls
            content += out.content
        end = s.finish()
        deltas += end.calls
        content += end.content
        calls = assemble(deltas)
        assert [(c.name, c.arguments.replace(" ", "")) for c in calls] == [
            ("a", '{"x":1}'),
            ("b", "{}"),
        ]
        assert content == ""
        assert (s.parsed, s.failed) == (2, 0)
