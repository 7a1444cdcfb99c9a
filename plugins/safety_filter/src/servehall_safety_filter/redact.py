"""Rewriting original text: replace matched spans by their rule's replacement."""

from __future__ import annotations

from collections.abc import Iterable


def merge_spans(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Sort ``(start, end, replacement)`` spans and merge overlapping ones.

    Overlapping spans become one span covering both, written with the replacement of
    the one that starts first.
    """
    out: list[tuple[int, int, str]] = []
    for s, e, rep in sorted(spans, key=lambda x: (x[0], -x[1])):
        if out and s < out[-1][1]:
            ps, pe, prep = out[-1]
            out[-1] = (ps, max(pe, e), prep)
        else:
            out.append((s, e, rep))
    return out


def apply_spans(text: str, spans: list[tuple[int, int, str]], base: int = 0) -> str:
    """``text`` (which starts at absolute offset ``base``) with merged ``spans`` replaced.

    Spans must be merged (:func:`merge_spans`) and lie within ``text``.
    """
    parts: list[str] = []
    pos = 0
    for s, e, rep in spans:
        parts.append(text[pos : s - base])
        parts.append(rep)
        pos = e - base
    parts.append(text[pos:])
    return "".join(parts)
