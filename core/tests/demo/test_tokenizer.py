"""Tests of servehall.demo.tokenizer: the Jinja-free renderers agree with the demo chat
template (rendered here with Jinja2 the way transformers does), the template's strictness,
and a tokenizer trained on a small corpus (special-token ids, BOS, tag tokens, files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servehall.demo.tokenizer import (
    BOS,
    DEMO_CHAT_TEMPLATE,
    END,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    render_chat,
    render_tool_chat,
    train_tokenizer,
    write_tokenizer_files,
)

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402


class TemplateError(Exception):
    """What the template's ``raise_exception`` raises."""


def _jinja(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
) -> str:
    """Render :data:`DEMO_CHAT_TEMPLATE` as transformers' ``apply_chat_template`` does."""

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False}
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env.from_string(DEMO_CHAT_TEMPLATE).render(
        messages=messages, tools=tools, bos_token=BOS, **kw
    )


CHAT = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Más?")]


@pytest.mark.parametrize("gen", [False, True])
def test_render_chat_matches_the_template(gen: bool) -> None:
    messages = [{"role": r, "content": c} for r, c in CHAT]
    want = _jinja(messages, add_generation_prompt=gen)
    assert render_chat(CHAT, add_generation_prompt=gen) == want
    assert want.startswith(BOS + "<|system|>\nBe brief.<|end|>\n")
    assert want.endswith("<|assistant|>\n" if gen else f"Más?{END}\n")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "ü"}}}]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Weather?"}],
        [{"role": "system", "content": "You are kind."}, {"role": "user", "content": "Weather?"}],
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                    {"function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}},
                ],
            },
            {"role": "tool", "content": '{"temp": 3}'},
            {"role": "assistant", "content": "3 °C."},
        ],
    ],
)
@pytest.mark.parametrize("with_tools", [False, True])
def test_render_tool_chat_matches_the_template(
    messages: list[dict[str, Any]], with_tools: bool
) -> None:
    tools = TOOLS if with_tools else None
    want = _jinja(messages, tools, add_generation_prompt=True)
    assert render_tool_chat(messages, tools, add_generation_prompt=True) == want
    if with_tools:
        assert want.count("\n<tools>\n") == 1 and '"city": "ü"' in want
        if messages[0]["role"] == "system":
            assert want.startswith(BOS + "<|system|>\nYou are kind.\n\n# Tools")


def test_tool_calls_render_hermes_style() -> None:
    out = render_tool_chat(
        [
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
            },
            {"role": "tool", "content": "42"},
        ]
    )
    assert out == (
        BOS
        + '<|assistant|>\nok<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
        + "<|end|>\n<|user|>\n<tool_response>\n42\n</tool_response><|end|>\n"
    )


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], "messages must not be empty"),
        ([{"role": "robot", "content": "x"}], "unknown role 'robot'"),
        (
            [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}],
            "a system message may only come first",
        ),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "must be a string"),
    ],
)
def test_the_template_is_strict(messages: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(TemplateError, match=error):
        _jinja(messages)


@pytest.fixture(scope="module")
def tok() -> Any:
    pytest.importorskip("tokenizers")
    lines = [
        render_chat([("user", f"Tell me about item {i}."), ("assistant", f"Item {i} is fine.")])
        for i in range(200)
    ] + ["the quick brown fox jumps over the lazy dog"] * 50
    return train_tokenizer(lines)


def test_special_tokens_have_ids_0_to_6_and_tags_follow(tok: Any) -> None:
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(7))
    vocab = tok.get_vocab_size()
    tags = [tok.token_to_id(t) for t in TAG_TOKENS]
    assert tags == [vocab - 2, vocab - 1]
    for tag in TAG_TOKENS:
        ids = tok.encode(tag, add_special_tokens=False).ids
        assert ids == [tok.token_to_id(tag)]


def test_encoding_prepends_bos_only_with_special_tokens(tok: Any) -> None:
    text = "the quick brown fox"
    plain = tok.encode(text, add_special_tokens=False).ids
    assert tok.encode(text).ids == [0, *plain]
    assert tok.decode(plain) == text
    # a rendered chat keeps its special tokens as single ids
    ids = tok.encode(render_chat([("user", "hi")]), add_special_tokens=False).ids
    assert ids[0] == 0 and ids[1] == tok.token_to_id("<|user|>")
    assert tok.token_to_id(END) in ids


def test_tokenizer_files(tok: Any, tmp_path: Path) -> None:
    write_tokenizer_files(tok, tmp_path, chat_template="{{ x }}", model_max_length=123)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == "{{ x }}" and cfg["model_max_length"] == 123
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == (BOS, END, "<|pad|>")
    assert sorted(cfg["added_tokens_decoder"], key=int) == [str(i) for i in range(7)]
    assert cfg["added_tokens_decoder"]["5"]["content"] == "<|assistant|>"
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": "<|pad|>",
    }
    from tokenizers import Tokenizer

    again = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert again.encode("the lazy dog").ids == tok.encode("the lazy dog").ids
