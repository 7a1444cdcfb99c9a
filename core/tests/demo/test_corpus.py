"""Tests of servehall.demo.corpus: the demo model's training documents — their shapes,
determinism in the seed, the mix of kinds, and the tokenizer corpus's flattening."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from servehall.demo import corpus
from servehall.demo.corpus import (
    DRILLS,
    STRUCTURED_SHARE,
    chat_turn,
    documents,
    drill,
    paragraph,
    sentence,
    tokenizer_corpus,
)
from servehall.demo.tokenizer import SPECIAL_TOKENS


def test_sentences_are_capitalised_and_end_with_a_period() -> None:
    rng = random.Random(1)
    for _ in range(200):
        s = sentence(rng)
        assert s[0].isupper() and s.endswith(".") and s.count(".") == 1
        assert s.split()[0].lower() in {w.split()[0].lower() for w in corpus.SUBJECTS}


def test_paragraph_has_n_sentences() -> None:
    rng = random.Random(2)
    for n in (1, 3, 5):
        assert paragraph(rng, n).count(".") == n
    assert paragraph(rng, 0) == ""


def test_drill_repeats_one_drill_3_to_8_times() -> None:
    rng = random.Random(3)
    for _ in range(100):
        line = drill(rng)
        d = next(x for x in DRILLS if line.startswith(x))
        assert line == " ".join([d] * (line.count(d)))
        assert 3 <= line.count(d) <= 8


def test_chat_turn_asks_about_a_topic_and_answers_in_prose() -> None:
    rng = random.Random(4)
    for _ in range(100):
        q, a = chat_turn(rng)
        assert any(t in q for t in corpus.TOPICS)
        assert 1 <= a.count(".") <= 3


def test_documents_are_deterministic_in_the_seed() -> None:
    a = list(documents(7, n_docs=50))
    assert a == list(documents(7, n_docs=50))
    assert a != list(documents(8, n_docs=50))


def test_documents_mix() -> None:
    docs = list(documents(0, n_docs=2000))
    kinds = Counter(kind for kind, _ in docs)
    prose = kinds["text"] + kinds["drill"] + kinds["chat"]
    assert prose == 2000
    # text 45 %, drill 10 %, chat 45 % of the prose documents (within sampling noise)
    assert 0.40 < kinds["text"] / prose < 0.50 and 0.07 < kinds["drill"] / prose < 0.13
    for kind, share in STRUCTURED_SHARE.items():
        assert abs(kinds[kind] / prose - share) < 0.05, kind


def test_document_payload_shapes() -> None:
    for kind, payload in documents(5, n_docs=300):
        if kind in ("text", "drill"):
            assert isinstance(payload, str) and payload
        elif kind == "json":
            assert isinstance(payload, str)
            json.loads(payload)
        elif kind in ("chat", "json_chat"):
            assert isinstance(payload, list) and 1 <= len(payload) <= 2
            assert all(isinstance(q, str) and isinstance(a, str) for q, a in payload)
        elif kind in ("tools", "forced"):
            tools, messages = payload  # type: ignore[misc]
            assert tools and messages[-1]["role"] == "assistant"
        else:
            pytest.fail(f"unknown kind {kind}")


def test_tokenizer_corpus_flattens_without_special_tokens() -> None:
    lines = tokenizer_corpus(0)
    assert lines == tokenizer_corpus(0)
    assert all(line for line in lines)
    assert not any(t in line for line in lines for t in SPECIAL_TOKENS)
    # the tool-call tags and tool listings survive as text
    assert any(line == "<tool_call>" for line in lines)
    assert any(line.startswith('{"type": "function"') for line in lines)
    # every chat's question and answer is its own line
    first_chat = next(p for k, p in documents(0) if k == "chat")
    q, a = first_chat[0]  # type: ignore[index]
    i = lines.index(q)
    assert lines[i + 1] == a
