"""The output stream filter: hold-back window, blocks across chunk splits, redaction."""

from __future__ import annotations

import random

import pytest

from servehall import PromptParts
from servehall_safety_filter.input_filter import SafetyInputFilter
from servehall_safety_filter.testing import book, chunked, run_stream, stream_of

TEXT = (
    "Once upon a time the model said: this is a forbidden phrase, really. "
    "And then it went on talking about other things for a while."
)


def _book() -> object:
    return book(rules=[{"name": "no-forbidden", "keywords": ["forbidden phrase"]}])


def test_block_with_phrase_split_across_every_possible_boundary() -> None:
    b = _book()
    start = TEXT.index("forbidden")
    for size in range(1, 12):
        run = run_stream(stream_of(b), chunked(TEXT, size))  # type: ignore[arg-type]
        assert run.blocked, size
        # the text before the phrase is sent, no character of the phrase ever is
        assert run.text == TEXT[:start], size
        assert [v.rule for v in run.verdicts if v.action == "block"] == ["no-forbidden"]


def test_no_partial_phrase_leaks_before_the_block() -> None:
    b = _book()
    flt = stream_of(b)  # type: ignore[arg-type]
    sent = ""
    for ch in TEXT:
        r = flt.feed(ch)
        sent += r.text
        assert "forb" not in sent
        if r.blocked:
            break
    assert r.blocked
    assert flt.feed("more").blocked and flt.feed("more").text == ""
    assert flt.finish().blocked


def test_random_chunkings_of_clean_text_pass_unchanged() -> None:
    b = _book()
    rng = random.Random(1)
    clean = TEXT.replace("forbidden phrase", "forbidden fruit")
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(clean)), rng.randint(1, 30)))
        pieces = [clean[i:j] for i, j in zip([0, *cuts], [*cuts, len(clean)], strict=True)]
        run = run_stream(stream_of(b), pieces)  # type: ignore[arg-type]
        assert not run.blocked and run.text == clean and run.verdicts == []


def test_hold_back_is_bounded_by_the_longest_rule() -> None:
    b = _book()
    flt = stream_of(b)  # type: ignore[arg-type]
    window = len("forbidden phrase") + 1
    sent = ""
    fed = ""
    for ch in "word " * 40:
        fed += ch
        sent += flt.feed(ch).text
        assert len(fed) - len(sent) <= window + 1  # +1: the normaliser's pending char
    assert sent + flt.finish().text == fed


def test_zero_width_and_fullwidth_evasion_is_blocked_in_streams() -> None:
    b = _book()
    evasive = "ok then ＦＯＲ\u200bBIDDEN\u200d  Phrase and more"
    run = run_stream(stream_of(b), chunked(evasive, 2))  # type: ignore[arg-type]
    assert run.blocked and run.text == "ok then "


def test_whole_word_keywords_do_not_match_inside_words() -> None:
    b = book(rules=[{"name": "ass", "keywords": ["ass"]}])
    run = run_stream(stream_of(b), chunked("I assume a class passes", 3))
    assert not run.blocked and run.text == "I assume a class passes"
    run = run_stream(stream_of(b), chunked("you ass.", 3))
    assert run.blocked and run.text == "you "


def test_keyword_at_the_very_end_is_caught_on_finish() -> None:
    b = _book()
    run = run_stream(stream_of(b), ["the forbidden ", "phrase"])  # type: ignore[arg-type]
    assert run.blocked and run.text == "the "


def test_redaction_in_streams_matches_whole_text_redaction() -> None:
    b = book(
        rules=[
            {"name": "email", "detector": "email", "action": "redact"},
            {"name": "card", "detector": "payment_card", "action": "redact"},
            {"name": "secret", "keywords": ["project x"], "action": "redact"},
        ]
    )
    text = (
        "Contact Jane.Doe+news@Mail.Example.org about Project\u200b X; card "
        "4242-4242-4242-4242 expires soon. Not a card: 4242 4242 4242 4241. Bye."
    )
    expected = (
        "Contact [EMAIL] about [REDACTED]; card [CARD] expires soon. "
        "Not a card: 4242 4242 4242 4241. Bye."
    )
    rng = random.Random(3)
    for size in (1, 2, 3, 5, 8, 13, 200):
        run = run_stream(stream_of(b), chunked(text, size))
        assert run.text == expected, size
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 25)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        run = run_stream(stream_of(b), pieces)
        assert run.text == expected
        counts = {v.rule: 0 for v in run.verdicts}
        for v in run.verdicts:
            counts[v.rule] += v.count
            assert v.stage == "output" and v.action == "redact"
        assert counts == {"email": 1, "card": 1, "secret": 1}


def test_redaction_then_block_releases_redacted_prefix_only() -> None:
    b = book(
        rules=[
            {"name": "email", "detector": "email", "action": "redact"},
            {"name": "stop", "keywords": ["stop word"]},
        ]
    )
    run = run_stream(stream_of(b), chunked("mail a@b.io then stop word and x@y.io", 4))
    assert run.blocked
    assert run.text == "mail [EMAIL] then "


def test_flag_allows_and_records() -> None:
    b = book(rules=[{"name": "mention", "keywords": ["llama"], "action": "flag"}])
    run = run_stream(stream_of(b), chunked("a llama and another Llama", 3))
    assert not run.blocked and run.text == "a llama and another Llama"
    assert sum(v.count for v in run.verdicts if v.rule == "mention") == 2
    assert all(v.action == "flag" and not v.monitor for v in run.verdicts)


def test_monitor_mode_records_but_does_not_enforce() -> None:
    b = book(
        rules=[
            {"name": "no-forbidden", "keywords": ["forbidden phrase"]},
            {"name": "email", "detector": "email", "action": "redact"},
        ],
        policies={
            "trial": {"rules": ["no-forbidden", "email"], "mode": "monitor"},
        },
        default_policy="trial",
    )
    text = "a forbidden phrase and a@b.io here"
    run = run_stream(stream_of(b), chunked(text, 3))
    assert not run.blocked and run.text == text
    got = sorted((v.rule, v.action, v.monitor) for v in run.verdicts)
    assert got == [("email", "redact", True), ("no-forbidden", "block", True)]


def test_regex_rule_split_across_chunks() -> None:
    b = book(rules=[{"name": "ticket", "detector": "regex", "patterns": [r"tkt-\d{6}"]}])
    run = run_stream(stream_of(b), ["see TK", "T-12", "34", "56 now"])
    assert run.blocked and run.text == "see "
    run = run_stream(stream_of(b), ["see TK", "T-12", "34", "5 now"])
    assert not run.blocked and run.text == "see TKT-12345 now"


@pytest.mark.parametrize("size", [1, 4])
def test_output_only_and_input_only_stages(size: int) -> None:
    b = book(
        rules=[
            {"name": "in-only", "keywords": ["alpha"], "stages": ["input"]},
            {"name": "out-only", "keywords": ["beta"], "stages": ["output"]},
        ]
    )
    assert not run_stream(stream_of(b), chunked("alpha", size)).blocked
    assert run_stream(stream_of(b), chunked("beta", size)).blocked


def test_contributed_detector_runs_in_streams() -> None:
    b = book(
        rules=[
            {
                "name": "shouting",
                "detector": "servehall_safety_filter.testing:RepeatDetector",
                "options": {"char": "!", "times": 3},
                "action": "redact",
            }
        ]
    )
    run = run_stream(stream_of(b), chunked("wow!!! ok!! yes!!!!", 2))
    assert run.text == "wow[REDACTED] ok!! yes[REDACTED]"


def test_long_stream_trims_its_buffer_and_stays_exact() -> None:
    b = book(
        rules=[
            {"name": "email", "detector": "email", "action": "redact"},
            {"name": "iban", "detector": "iban", "action": "redact"},
            {"name": "stop", "keywords": ["final forbidden words"]},
        ]
    )
    rng = random.Random(5)
    parts = []
    expected = []
    for i in range(600):
        if i % 37 == 5:
            parts.append(f"user{i}@mail.example.net")
            expected.append("[EMAIL]")
        elif i % 53 == 7:
            parts.append("GB82 WEST 1234 5698 7654 32")
            expected.append("[IBAN]")
        else:
            w = rng.choice(["alpha", "beta", "gamma", "Final", "forbidden", "word"])
            parts.append(w)
            expected.append(w)
    clean = " ".join(parts)
    assert len(clean) > 3000
    flt = stream_of(b)
    run = run_stream(flt, [clean[i : i + 3] for i in range(0, len(clean), 3)])
    assert not run.blocked and run.text == " ".join(expected)
    assert len(flt._text) < 1024 + 300  # the normalised buffer was trimmed
    blocked = clean + " and then final  FORBIDDEN words appear"
    run = run_stream(stream_of(b), [blocked[i : i + 5] for i in range(0, len(blocked), 5)])
    assert run.blocked and run.text == " ".join(expected) + " and then "


def test_finish_without_feed_and_empty_feeds() -> None:
    b = _book()
    flt = stream_of(b)  # type: ignore[arg-type]
    assert flt.feed("").text == ""
    assert flt.finish().text == ""
    assert flt.finish().text == "" and not flt.finish().blocked


def test_any_chunking_gives_the_same_result_as_one_piece() -> None:
    """Differential check: streamed in random pieces == judged as one piece."""
    b = book(
        rules=[
            {"name": "email", "detector": "email", "action": "redact"},
            {"name": "card", "detector": "payment_card", "action": "redact"},
            {"name": "phone", "detector": "phone", "action": "redact"},
            {"name": "iban", "detector": "iban", "action": "redact"},
            {"name": "tag", "keywords": ["blue moon"], "action": "flag"},
            {"name": "stop", "keywords": ["red sun", "zorg"]},
        ]
    )
    rng = random.Random(11)
    vocab = [
        "blue", "moon", "red", "sun", "ＲＥＤ", "s\u200bun", "zorg", "zorgs", "a@b.io",
        "x.y@z-q.example", "4111 1111 1111 1111", "4111111111111112", "+44 20 7946 0958",
        "(555) 123-4567", "DE89 3704 0044 0532 0130 00", "e\u0301", "  ", "\n", ",", "1999",
    ]  # fmt: skip
    for _ in range(300):
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 25)))
        one = run_stream(stream_of(b), [text])
        cuts = sorted(set(rng.randint(1, max(1, len(text) - 1)) for _ in range(rng.randint(0, 12))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        many = run_stream(stream_of(b), pieces)
        assert (many.text, many.blocked) == (one.text, one.blocked), (text, pieces)

        def counts(run: object) -> dict[tuple[str, str], int]:
            out: dict[tuple[str, str], int] = {}
            for v in run.verdicts:  # type: ignore[attr-defined]
                out[(v.rule, v.action)] = out.get((v.rule, v.action), 0) + v.count
            return out

        if not one.blocked:
            assert counts(many) == counts(one), (text, pieces)
        # and the same as the input filter's whole-text search on the same text
        parts = PromptParts(texts=[text], endpoint="/v1/completions", model="m")
        verdicts = SafetyInputFilter(b).check(parts)
        blocked = any(v.action == "block" for v in verdicts)
        assert blocked == one.blocked, text
        if not blocked:
            assert parts.texts[0] == one.text, text


def test_regex_lookahead_context_is_held_back() -> None:
    # "foo" is only a match when "barbaz" follows: the window covers the look-ahead
    b = book(rules=[{"name": "la", "detector": "regex", "patterns": [r"foo(?=barbaz)"]}])
    assert b.default.output.window == 9
    for size in (1, 2, 3, 4):
        run = run_stream(stream_of(b), chunked("xx foobarbaz yy", size))
        assert run.blocked and run.text == "xx ", size
        run = run_stream(stream_of(b), chunked("xx foobarbax yy", size))
        assert not run.blocked and run.text == "xx foobarbax yy", size


def test_record_only_rules_never_delay_output() -> None:
    b = book(
        rules=[
            {"name": "no-forbidden", "keywords": ["forbidden phrase"]},
            {"name": "email", "detector": "email", "action": "flag"},
        ],
        policies={
            "trial": {"rules": ["no-forbidden", "email"], "mode": "monitor"},
            "mixed": {"rules": ["no-forbidden", "email"]},
        },
        default_policy="trial",
        tenant_policies={"t": "mixed"},
    )
    text = "write to a@b.io: the forbidden phrase. " * 3
    flt = stream_of(b)
    verdicts = []
    for piece in chunked(text, 3):
        r = flt.feed(piece)
        assert r.text == piece and not r.blocked  # monitor mode: sent at once
        verdicts += r.verdicts
    verdicts += flt.finish().verdicts
    totals: dict[str, int] = {}
    for v in verdicts:
        assert v.monitor
        totals[v.rule] = totals.get(v.rule, 0) + v.count
    assert totals == {"no-forbidden": 3, "email": 3}
    # enforced keyword + flagged e-mail: only the keyword's short window is held back
    flt = stream_of(b, "t")
    sent = ""
    for i, piece in enumerate(chunked("plain words only " * 10, 1)):
        sent += flt.feed(piece).text
        assert i + 1 - len(sent) <= len("forbidden phrase") + 2


def test_results_state_the_input_they_consumed() -> None:
    """``consumed``: the original characters released so far; on a block, the start of
    the match — also after a redaction of different length (the host counts the
    completion tokens of that text only)."""
    b = book(
        rules=[
            {"name": "no-forbidden", "keywords": ["forbidden phrase"]},
            {"name": "red-model", "keywords": ["model"], "action": "redact"},
        ]
    )
    start = TEXT.index("forbidden")
    for size in (1, 3, 7, 200):
        flt = stream_of(b)  # type: ignore[arg-type]
        sent, last = "", 0
        for chunk in chunked(TEXT, size):
            r = flt.feed(chunk)
            sent += r.text
            if r.consumed is not None:
                assert r.consumed >= last
                last = r.consumed
            if r.blocked:
                break
        assert r.blocked and r.consumed == start, size
        assert "model" not in sent and sent.endswith("said: this is a ")
