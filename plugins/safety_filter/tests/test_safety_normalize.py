"""Normalisation: NFKC + case folding, zero-width removal, whitespace, offset map."""

from __future__ import annotations

import random

from servehall_safety_filter.normalize import Normalizer, normalize_text


def test_nfkc_and_casefold() -> None:
    norm, _, _ = normalize_text("ＦＵＬＬwidth Straße ﬁne")
    assert norm == "fullwidth strasse fine"


def test_zero_width_and_format_characters_are_dropped() -> None:
    text = "b\u200ba\u200cd\u200d w\u2060o\ufeffr\u00add"
    norm, starts, ends = normalize_text(text)
    assert norm == "bad word"
    # every normalised char maps back to the original character it came from
    for i, ch in enumerate(norm):
        assert text[starts[i] : ends[i]].casefold() == ch


def test_whitespace_runs_collapse_to_one_space() -> None:
    norm, starts, _ = normalize_text("  a \t\n b\u00a0\u2003c  ")
    assert norm == "a b c "
    assert starts[0] == 2


def test_combining_marks_compose_across_pushes() -> None:
    n = Normalizer()
    a = n.push("cafe")
    b = n.push("\u0301 ok")
    c = n.flush()
    text = a[0] + b[0] + c[0]
    assert text == "café ok"
    starts = a[1] + b[1] + c[1]
    ends = a[2] + b[2] + c[2]
    i = text.index("é")
    assert (starts[i], ends[i]) == (3, 5)  # "e" + U+0301 in the original


def test_incremental_equals_whole_text_for_any_split() -> None:
    rng = random.Random(7)
    text = "Hello  ＷＯＲＬＤ\u200b! Straße e\u0301\u0301 tab\there \u00a0 done Ǆ ﬀ."
    whole = normalize_text(text)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 8)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        n = Normalizer()
        out = ("", [], [])
        for p in pieces:
            t, s, e = n.push(p)
            out = (out[0] + t, out[1] + s, out[2] + e)
        t, s, e = n.flush()
        assert (out[0] + t, out[1] + s, out[2] + e) == whole


def test_normalized_fast_form_equals_full_normalisation() -> None:
    from servehall_safety_filter.normalize import normalized

    rng = random.Random(3)
    alphabet = "aB z\t\n\r\x0b\x0c\x1c\x1f,.-ÉéＡ\u200b\u00a0 "
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert normalized(text) == normalize_text(text)[0], repr(text)
