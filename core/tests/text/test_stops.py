"""Stop strings across token boundaries, never leaking a partial stop."""

from __future__ import annotations

import pytest

from servehall.text import StopMatcher


def _run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out = []
    stopped = False
    for p in pieces:
        text, stopped = m.feed(p)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(m.flush())
    return out, stopped


def test_stop_inside_a_token() -> None:
    out, stopped = _run(["DE"], ["ABC", "DEF", "GH"])
    assert stopped and "".join(out) == "ABC"


def test_stop_across_tokens_never_leaks_prefix() -> None:
    out, stopped = _run(["DE"], ["ABC", "D", "E", "F"])
    assert stopped and out == ["ABC", "", ""]


def test_partial_prefix_released_when_not_a_stop() -> None:
    out, stopped = _run(["DE"], ["ABD", "X"])
    assert not stopped and out == ["AB", "DX", ""]


def test_no_stop_flushes_all() -> None:
    out, stopped = _run(["zz"], ["a", "bz"])
    assert not stopped and "".join(out) == "abz" and out[1] == "b"


def test_earliest_of_several_stops() -> None:
    out, stopped = _run(["world", "lo w"], ["hello world"])
    assert stopped and out == ["hel"]


def test_empty_stop_refused() -> None:
    with pytest.raises(ValueError):
        StopMatcher([""])


def test_feeds_after_stop_are_empty() -> None:
    m = StopMatcher(["x"])
    assert m.feed("axb") == ("a", True)
    assert m.feed("more") == ("", True)
