"""Tool-call streams (servehall.tools): what the parsers read from model output, and the
streaming fuzz test — a recorded output re-split at every token boundary (the text each
token adds, through the real incremental detokenizer) must reassemble into exactly the
content and ``tool_calls`` of the whole output read at once (vLLM #11392/#32152, OVMS
#3838: streamed arguments that differ or lose the final ``}``)."""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.text import TextTokenizer, load_tokenizer
from servehall.tools import HERMES, LLAMA3_JSON, ToolCall, ToolCallStream, assemble
from servehall.tools.forced import REQUIRED_FORMAT, NamedCallStream
from servehall.tools.scanner import JsonCallStream

Result = tuple[str, list[ToolCall], int, int]


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def read(make: Callable[[], ToolCallStream], pieces: Sequence[str]) -> Result:
    """Feed ``pieces`` to a fresh stream: (content, calls, parsed, failed)."""
    stream = make()
    content, deltas = "", []
    for p in pieces:
        out = stream.feed(p)
        content += out.content
        deltas += out.calls
    out = stream.finish()
    content += out.content
    deltas += out.calls
    # the first piece of every call names it; later pieces carry arguments only
    seen: set[int] = set()
    for d in deltas:
        assert (d.name is not None) == (d.index not in seen), d
        seen.add(d.index)
    return content, assemble(deltas), stream.parsed, stream.failed


def hermes() -> ToolCallStream:
    return HERMES.stream(_ids())


def llama() -> ToolCallStream:
    return LLAMA3_JSON.stream(_ids())


def required() -> ToolCallStream:
    return JsonCallStream(REQUIRED_FORMAT, _ids())


def named() -> ToolCallStream:
    return NamedCallStream("lookup", _ids())


# (stream, output, content, [(name, arguments)], parsed, failed)
CASES: list[tuple[Callable[[], ToolCallStream], str, str, list[tuple[str, str]], int, int]] = [
    (
        hermes,
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "units": ["c", "f"]}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
        "Let me check.",
        [
            ("get_weather", '{"city": "Paris", "units": ["c", "f"]}'),
            ("get_time", '{"tz": "Europe/Paris"}'),
        ],
        2,
        0,
    ),
    (  # markers, braces and escaped quotes inside strings are text; unicode survives
        hermes,
        '<tool_call>{"name": "say", "arguments": {"text": "a </tool_call> {\\"x\\": '
        '[1}] 😀 中文"}}</tool_call>',
        "",
        [("say", '{"text": "a </tool_call> {\\"x\\": [1}] 😀 中文"}')],
        1,
        0,
    ),
    (  # arguments before the name; the end marker right after the object
        hermes,
        '<tool_call>{"arguments": {"q": 1}, "name": "f"}</tool_call> done',
        " done",
        [("f", '{"q": 1}')],
        1,
        0,
    ),
    (  # the model forgot the closing brace of the call object: arguments stay whole
        hermes,
        '<tool_call>\n{"name": "f", "arguments": {"a": {"b": 2}}\n</tool_call>',
        "",
        [("f", '{"a": {"b": 2}}')],
        1,
        0,
    ),
    (  # cut by max_tokens inside the arguments: a call, counted failed
        hermes,
        '<tool_call>\n{"name": "f", "arguments": {"a": "unfinished',
        "",
        [("f", '{"a": "unfinished')],
        0,
        1,
    ),
    (  # no name: the text is content as written, markers included
        hermes,
        "ok <tool_call>not json</tool_call> and <tool_ca",
        "ok <tool_call>not json</tool_call> and <tool_ca",
        [],
        0,
        1,
    ),
    (hermes, "plain answer, trailing space \n", "plain answer, trailing space \n", [], 0, 0),
    (
        llama,
        ' {"name": "f", "parameters": {"q": "x;y"}}; {"name": "g", "parameters": {}}',
        "",
        [("f", '{"q": "x;y"}'), ("g", "{}")],
        2,
        0,
    ),
    (llama, "The answer is 4.", "The answer is 4.", [], 0, 0),
    (llama, '{"foo": 1} is JSON', '{"foo": 1} is JSON', [], 0, 1),
    (
        required,
        '[{"name": "f", "parameters": {"a": true}}, {"name": "g", "parameters": {"b": null}}]',
        "",
        [("f", '{"a": true}'), ("g", '{"b": null}')],
        2,
        0,
    ),
    (named, '{"id": 7, "tags": ["x"]}', "", [("lookup", '{"id": 7, "tags": ["x"]}')], 1, 0),
]


@pytest.mark.parametrize("make, text, content, calls, parsed, failed", CASES)
def test_parsers_read_the_whole_output(
    make: Callable[[], ToolCallStream],
    text: str,
    content: str,
    calls: list[tuple[str, str]],
    parsed: int,
    failed: int,
) -> None:
    got_content, got_calls, got_parsed, got_failed = read(make, [text])
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"call_{i}" for i in range(len(calls))]
    assert (got_parsed, got_failed) == (parsed, failed)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    return load_tokenizer(build_tokenizer(tmp_path_factory.mktemp("tok")))


def token_texts(tok: TextTokenizer, text: str) -> list[str]:
    """The text each token of ``text`` adds, as the server's detokenizer yields it."""
    detok = tok.new_detokenizer()
    pieces = [detok.feed([i]) for i in tok.encode_plain(text)]
    pieces.append(detok.finish())
    assert "".join(pieces) == text
    return pieces


@pytest.mark.parametrize("case", range(len(CASES)))
def test_streaming_fuzz_every_token_boundary(tok: TextTokenizer, case: int) -> None:
    make, text, *_ = CASES[case]
    whole = read(make, [text])
    pieces = token_texts(tok, text)
    assert len(pieces) > 10
    assert read(make, pieces) == whole  # one token per delta
    for k in range(len(pieces) + 1):  # every token boundary
        assert read(make, ["".join(pieces[:k]), "".join(pieces[k:])]) == whole, k
    rng = random.Random(case)
    for _ in range(200):  # random groups of tokens (a worker's merged steps)
        cuts = sorted(rng.sample(range(len(pieces) + 1), rng.randint(1, 6)))
        groups = ["".join(pieces[a:b]) for a, b in itertools.pairwise([0, *cuts, len(pieces)])]
        assert read(make, groups) == whole
    for k in range(len(text) + 1):  # and every character boundary
        assert read(make, [text[:k], text[k:]]) == whole, k
