"""Incremental detokenization: equals a full decode, never emits a split character."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.text import TextTokenizer, load_tokenizer
from servehall.text.detokenize import IncrementalDetokenizer

TEXTS = [
    "Hello world, the quick brown fox.",
    "système café naïve — emoji 😀 🎉 中文字符 日本語",
    "mixed 😀x🎉y 中z",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    return load_tokenizer(build_tokenizer(tmp_path_factory.mktemp("tok")))


def _stream(detok: IncrementalDetokenizer, ids: list[int], step: int) -> list[str]:
    out = [detok.feed(ids[i : i + step]) for i in range(0, len(ids), step)]
    out.append(detok.finish())
    return out


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_byte_table_stream_equals_full_decode(tok: TextTokenizer, text: str, step: int) -> None:
    ids = tok.encode_plain(text)
    pieces = _stream(tok.new_detokenizer(), ids, step)
    assert "".join(pieces) == text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_byte_level_tokens_split_characters(tok: TextTokenizer) -> None:
    # a 4-byte emoji is spread over several byte tokens: no piece may hold half of it
    ids = tok.encode_plain("😀🎉")
    assert len(ids) > 2
    pieces = _stream(tok.new_detokenizer(), ids, 1)
    assert "".join(pieces) == "😀🎉" and "" in pieces


@pytest.mark.parametrize("text", TEXTS)
def test_offset_window_fallback(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode_plain(text)
    pieces = _stream(IncrementalDetokenizer(None, tok.hf.backend_tokenizer), ids, 1)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_special_tokens_are_skipped(tok: TextTokenizer) -> None:
    ids = [tok.hf.bos_token_id, *tok.encode_plain("ok"), tok.hf.eos_token_id]
    assert "".join(_stream(tok.new_detokenizer(), ids, 1)) == "ok"


def test_random_ids_match_full_decode(tok: TextTokenizer) -> None:
    rng = random.Random(0)
    vocab = tok.hf.backend_tokenizer.get_vocab_size()
    for _ in range(20):
        ids = [rng.randrange(vocab) for _ in range(30)]
        pieces = _stream(tok.new_detokenizer(), ids, 1)
        assert "".join(pieces) == tok.decode(ids)
