"""The recorder of client-library request bodies (servehall.bench.soak.record_sdk): its
canned replies (JSON and SSE, chat and completions, ``n`` choices), its capture server,
its usage line, that it imports only the standard library at module level (it runs in
any library's virtual environment), and a real recording of the ``openai`` SDK checked
against the committed ``data/sdk_bodies_openai.json``."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from servehall.bench.soak import record_sdk
from servehall.bench.soak.record_sdk import _drive, _reply, main

DATA = Path(record_sdk.__file__).parent / "data"


def _events(raw: bytes) -> list[Any]:
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    chunks = [c for c in text.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [json.loads(c[6:]) for c in chunks[:-1]]


def test_chat_reply_is_a_chat_completion_with_n_choices() -> None:
    raw, ctype = _reply({"model": "tiny", "n": 2}, "/v1/chat/completions")
    assert ctype == "application/json"
    data = json.loads(raw)
    assert data["object"] == "chat.completion" and data["model"] == "tiny"
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert json.loads(data["choices"][0]["message"]["content"]) == {"city": "Paris"}
    assert data["usage"]["total_tokens"] == 7


def test_completion_reply_and_a_bad_n() -> None:
    raw, _ = _reply({"n": "two"}, "/v1/completions")  # not an int: one choice
    data = json.loads(raw)
    assert data["object"] == "text_completion" and data["model"] == "demo"
    assert [c["text"] for c in data["choices"]] == [" Paris"]


def test_streamed_replies_end_with_a_usage_chunk_and_done() -> None:
    raw, ctype = _reply({"stream": True, "n": 2}, "/v1/chat/completions")
    assert ctype == "text/event-stream"
    events = _events(raw)
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * 3
    assert [e["choices"][0]["index"] for e in events[:2]] == [0, 1]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    text = _events(_reply({"stream": True}, "/v1/completions")[0])
    assert text[0]["choices"][0]["text"] == " Paris" and text[-1]["usage"]["total_tokens"] == 4


def test_drive_records_despite_failures_and_drains_streams(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[int] = []

    def stream() -> Any:
        for i in range(3):
            seen.append(i)
            yield i

    _drive("gen", stream)
    assert seen == [0, 1, 2]  # a streamed result is iterated to the end
    _drive("boom", lambda: 1 / 0)
    assert "boom: ZeroDivisionError (body recorded)" in capsys.readouterr().err


def test_usage_line_for_a_bad_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([]) == 2
    assert main(["cohere", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "usage: record_sdk.py {openai|instructor|pydantic_ai|langchain_openai|" in err
    assert not (tmp_path / "out.json").exists()


def test_the_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(record_sdk.__file__).read_text())
    top = set()
    for node in tree.body:  # module level only: the libraries are imported in recorders
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top


def test_a_real_openai_recording_matches_the_committed_one(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    out = tmp_path / "openai.json"
    assert main(["openai", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["library"] == "openai" and data["version"] == openai.__version__
    bodies = {b["name"]: b for b in data["bodies"]}
    committed = json.loads((DATA / "sdk_bodies_openai.json").read_text())
    assert [(b["name"], b["path"]) for b in data["bodies"]] == [
        (b["name"], b["path"]) for b in committed["bodies"]
    ]
    assert bodies["chat"]["body"]["messages"][1] == {
        "role": "user",
        "content": "Weather in Paris?",
    }
    assert bodies["chat_stream_usage"]["body"]["stream_options"] == {"include_usage": True}
    assert bodies["chat_parse_pydantic"]["body"]["response_format"]["type"] == "json_schema"
    assert bodies["completion_extra_body_guided"]["body"]["guided_choice"] == ["yes", "no"]
    # a second recording in the same process holds the same bodies, not twice as many
    again = tmp_path / "again.json"
    assert main(["openai", str(again)]) == 0
    assert len(json.loads(again.read_text())["bodies"]) == len(data["bodies"])
