"""Startup checks for operator-supplied regular expressions.

Python's ``re`` is a backtracking engine: a pattern with a quantified group that itself
contains an unbounded quantifier (``(a+)+``, ``(\\w+\\s?)*``) can take exponential time
on a near-miss. :func:`check_pattern` parses a pattern (``re._parser``, the stdlib's own
parser) and rejects such nested unbounded repeats, and reports the pattern's longest
possible match (``None`` when unbounded), which sizes the stream hold-back window.

This is a cheap heuristic, not a proof: overlapping alternatives under a star
(``(a|ab)*``) are not detected. Operators should prefer possessive quantifiers / atomic
groups (``\\w++``, ``(?>...)``) for untrusted input; see ``docs/safety_filter.md``.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python ≥ 3.11
    import re._constants as _c
    import re._parser as _p
except ImportError:  # pragma: no cover
    import sre_constants as _c
    import sre_parse as _p

UNBOUNDED = int(_c.MAXREPEAT)
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
MAX_LOOKBEHIND = 32
"""Longest look-behind a rule may use (the stream keeps this much judged context)."""
_BIG = 64  # an outer repeat allowing more than this many iterations counts as unbounded


class UnsafePatternError(ValueError):
    """A regular expression is invalid or risks catastrophic backtracking."""


def _children(op: Any, av: Any) -> list[Any]:
    """Sub-patterns directly below one parsed node."""
    if op in _REPEATS or op == getattr(_c, "POSSESSIVE_REPEAT", None):
        return [av[2]]
    if op == _c.SUBPATTERN:
        return [av[3]]
    if op == _c.BRANCH:
        return list(av[1])
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        return [av[1]]
    if op == getattr(_c, "ATOMIC_GROUP", None):
        return [av]
    if op == _c.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    return []


def _has_unbounded_repeat(sub: Any) -> bool:
    for op, av in sub:
        if op in _REPEATS and av[1] >= UNBOUNDED:
            return True
        if any(_has_unbounded_repeat(c) for c in _children(op, av)):
            return True
    return False


def _has_backref(sub: Any) -> bool:
    for op, av in sub:
        if op in (_c.GROUPREF, _c.GROUPREF_EXISTS):
            return True
        if any(_has_backref(c) for c in _children(op, av)):
            return True
    return False


def _nested_unbounded(sub: Any) -> bool:
    for op, av in sub:
        if op in _REPEATS and av[1] > _BIG and _has_unbounded_repeat(av[2]):
            return True
        if any(_nested_unbounded(c) for c in _children(op, av)):
            return True
    return False


def _assertions(sub: Any) -> tuple[int, int]:
    """``(sum of look-ahead widths, longest look-behind)`` anywhere in ``sub``."""
    ahead = behind = 0
    for op, av in sub:
        if op in (_c.ASSERT, _c.ASSERT_NOT):
            width = int(av[1].getwidth()[1])
            if av[0] < 0:
                behind = max(behind, width)
            else:
                ahead = min(UNBOUNDED, ahead + width)
        for c in _children(op, av):
            a, b = _assertions(c)
            ahead = min(UNBOUNDED, ahead + a)
            behind = max(behind, b)
    return ahead, behind


def _reach(parsed: Any) -> int | None:
    """Characters from a match's start that can decide it: the longest match plus every
    look-ahead's width (a conservative bound); None when unbounded."""
    hi = int(parsed.getwidth()[1])
    if hi >= UNBOUNDED - 1:
        return None
    ahead, _ = _assertions(parsed)
    return None if ahead >= UNBOUNDED - 1 else hi + ahead


def check_pattern(pattern: str) -> int | None:
    """Validate ``pattern``; return its reach in characters, None when unbounded.

    The reach is the longest match plus the width of its look-aheads: how far past a
    match's start the text must be known to decide it (it sizes the stream window).

    Raises:
        UnsafePatternError: the pattern does not compile, uses a back-reference, has a
            look-behind longer than :data:`MAX_LOOKBEHIND`, or nests an unbounded
            quantifier inside another repeat (catastrophic backtracking risk).
    """
    try:
        re.compile(pattern)
        parsed = _p.parse(pattern)
    except re.error as exc:
        raise UnsafePatternError(f"invalid regular expression {pattern!r}: {exc}") from None
    if _has_backref(parsed):
        raise UnsafePatternError(
            f"regular expression {pattern!r} uses a back-reference, which is not supported "
            "(rules are combined and renumbered)"
        )
    if _assertions(parsed)[1] > MAX_LOOKBEHIND:
        raise UnsafePatternError(
            f"regular expression {pattern!r} looks behind more than {MAX_LOOKBEHIND} characters"
        )
    if _nested_unbounded(parsed):
        raise UnsafePatternError(
            f"regular expression {pattern!r} nests an unbounded quantifier inside a repeat "
            "(catastrophic backtracking risk); bound the inner repeat or make it possessive"
        )
    return _reach(parsed)


def pattern_width(pattern: str) -> int | None:
    """Reach (see :func:`check_pattern`) of a trusted pattern; None when unbounded."""
    return _reach(_p.parse(pattern))
