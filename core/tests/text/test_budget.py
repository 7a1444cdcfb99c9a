"""servehall.text.budget: the safe lower bound on tokens per character (N31)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.errors import ContextLengthExceededError
from servehall.text.budget import check_prompt_chars, max_token_chars
from servehall.text.tokenizer import TextTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def demo_tok(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """A byte-level BPE tokenizer (the shape of GPT-2/Llama-3 tokenizers)."""
    return load_tokenizer(build_tokenizer(tmp_path_factory.mktemp("tok")))


def test_demo_tokenizer_has_a_bound(demo_tok: TextTokenizer) -> None:
    assert demo_tok.max_token_chars == max(len(t) for t in demo_tok._plain.get_vocab())
    assert demo_tok.max_token_chars is not None


@pytest.mark.parametrize(
    "text",
    [
        "word " * 2000,
        "ABCDEFGH ABCDEFGH ABC " * 300,
        " " * 5000,
        "\x00\n\t" * 1000,
        "é\u0301中文😀 " * 800,
        "the quick brown fox jumps over the lazy dog. " * 200,
    ],
)
def test_the_bound_never_exceeds_the_real_count(demo_tok: TextTokenizer, text: str) -> None:
    real = len(demo_tok.encode_plain(text))
    assert math.ceil(len(text) / demo_tok.max_token_chars) <= real


def test_a_tokenizer_that_drops_text_gets_no_bound() -> None:
    """BERT-style: whitespace is dropped by the pre-tokenizer (spaces are zero tokens)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    assert len(tok.encode(" " * 100).ids) == 0
    assert max_token_chars(tok) is None


def test_check_prompt_chars() -> None:
    check_prompt_chars(10_000, 4, 4096, "prompt")  # 2500 tokens at least: may fit
    check_prompt_chars(10**9, None, 4096, "prompt")  # no bound known: tokenize
    with pytest.raises(ContextLengthExceededError) as info:
        check_prompt_chars(2_095_000, 17, 2048, "messages")
    err = info.value
    assert err.status == 400 and err.code == "context_length_exceeded"
    assert err.param == "messages" and "at least 123236 tokens" in err.message
