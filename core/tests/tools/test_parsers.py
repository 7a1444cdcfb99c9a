"""``servehall.tools.parsers``: the built-in tool-call formats, the text of one call for
the grammar layer, and the parser a chat template suggests."""

from __future__ import annotations

import json

from servehall.tools.calls import assemble
from servehall.tools.parsers import HERMES, LLAMA3_JSON, guess_parser_name


def test_call_begin_puts_the_name_as_a_json_string() -> None:
    assert HERMES.call_begin("get_weather") == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert LLAMA3_JSON.call_begin('a"b') == '{"name": "a\\"b", "parameters": '


def test_calls_written_from_begin_and_end_read_back_as_those_calls() -> None:
    """The grammar layer writes ``begin + arguments + end`` per call: the parser must read
    two such calls in a row, leaving no text."""
    for parser, name in ((HERMES, "hermes"), (LLAMA3_JSON, "llama3_json")):
        assert parser.name == name
        text = "".join(
            parser.call_begin(f) + args + parser.end
            for f, args in (("lookup", '{"q": "x"'), ("two", "{"))
        )
        stream = parser.stream(lambda: "call_0")
        out, end = stream.feed(text), stream.finish()
        calls = assemble(out.calls + end.calls)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("lookup", {"q": "x"}),
            ("two", {}),
        ]
        assert stream.parsed == 2 and stream.failed == 0
        assert out.content + end.content == ""


def test_each_stream_is_fresh() -> None:
    a, b = HERMES.stream(), HERMES.stream()
    assert a is not b
    a.feed("<tool_call>")
    assert b.feed("plain").content == "plain"


def test_guess_parser_name() -> None:
    assert guess_parser_name(None) == "hermes"
    assert guess_parser_name("{% for m in messages %}<tool_call>") == "hermes"
    assert guess_parser_name("... <|python_tag|> ...") == "llama3_json"
    assert guess_parser_name('<|eom_id|> "parameters"') == "llama3_json"
    assert guess_parser_name("<|eom_id|> only") == "hermes"
