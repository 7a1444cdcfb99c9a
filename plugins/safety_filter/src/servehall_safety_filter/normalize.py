"""Text normalisation for matching, with an offset map back to the original text.

Matching runs on *normalised* text: NFKC, then case folding (``NFKC(casefold(NFKC(x)))``,
Unicode's NFKC_Casefold shape), with default-ignorable characters removed (zero-width
space/joiners, soft hyphen, bidi controls, variation selectors: every format character
of category ``Cf`` and a few others) and every run of whitespace collapsed to one space.
So ``"Ｂａｄ"``, ``"B\\u200bAD"`` and ``"bad"`` all read ``"bad"``.

Every normalised character carries the half-open span ``[start, end)`` of the original
characters it came from (absolute offsets in the original stream), so a match
``[a, b)`` in normalised text covers the original ``[starts[a], ends[b - 1])``.

Normalisation works per *cluster* (a base character and the combining marks after it),
because NFKC composes across them (``"e" + U+0301`` → ``"é"``). The incremental
:class:`Normalizer` therefore keeps the last cluster pending until a following base
character (or :meth:`Normalizer.flush`) shows it is complete.
"""

from __future__ import annotations

import re
import unicodedata

_EXTRA_IGNORABLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u3164\uffa0"
    + "".join(chr(c) for c in range(0xFE00, 0xFE10))
)
# ASCII text whose normalisation is not just ``.lower()``: whitespace runs and
# whitespace other than a plain space (both collapse to one space).
_ASCII_SLOW = re.compile(r"\s\s|[^\S ]")


def is_ignorable(ch: str) -> bool:
    """True for characters dropped before matching (zero-width, format, selectors)."""
    return (
        unicodedata.category(ch) == "Cf" or ch in _EXTRA_IGNORABLE or 0xE0100 <= ord(ch) <= 0xE01EF
    )


def fold(text: str) -> str:
    """NFKC + case folding of ``text`` (no whitespace or ignorable handling)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


class Normalizer:
    """Incremental normaliser: feed original text in pieces, get normalised text + spans.

    Call :meth:`push` with each piece and :meth:`flush` at the end. Each call returns
    ``(text, starts, ends)``: the newly final normalised characters and, per character,
    the absolute original start and end offsets. One instance per text stream.
    """

    __slots__ = ("_last_space", "_offset", "_pending")

    def __init__(self) -> None:
        self._pending = ""  # raw characters of the last, possibly incomplete cluster
        self._offset = 0  # absolute original offset of the next pushed character
        self._last_space = True  # collapse leading whitespace

    def push(self, raw: str) -> tuple[str, list[int], list[int]]:
        """Normalise more original text; the last cluster stays pending."""
        base = self._offset - len(self._pending)
        s = self._pending + raw
        self._offset += len(raw)
        if not s:
            return "", [], []
        if s.isascii() and _ASCII_SLOW.search(s) is None and not (self._last_space and s[0] == " "):
            # fast path: plain ASCII; hold back the last char (a combining mark may follow)
            n = len(s) - 1
            self._pending = s[n]
            if n == 0:
                return "", [], []
            self._last_space = s[n - 1] == " "
            return s[:n].lower(), list(range(base, base + n)), list(range(base + 1, base + n + 1))
        # find the start of the last cluster: it stays pending
        cut = len(s) - 1
        while cut > 0 and unicodedata.combining(s[cut]):
            cut -= 1
        self._pending = s[cut:]
        return self._normalize(s[:cut], base)

    def flush(self) -> tuple[str, list[int], list[int]]:
        """End of text: normalise whatever is pending."""
        s, self._pending = self._pending, ""
        return self._normalize(s, self._offset - len(s))

    def _normalize(self, s: str, base: int) -> tuple[str, list[int], list[int]]:
        out: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        i, n = 0, len(s)
        while i < n:
            j = i + 1
            while j < n and unicodedata.combining(s[j]):
                j += 1
            cluster = s[i:j]
            if cluster.isascii():
                folded = cluster.lower()
            else:
                kept = "".join(c for c in cluster if not is_ignorable(c))
                folded = fold(kept) if kept else ""
            for ch in folded:
                if ch.isspace():
                    if self._last_space:
                        continue
                    ch = " "
                    self._last_space = True
                else:
                    self._last_space = False
                out.append(ch)
                starts.append(base + i)
                ends.append(base + j)
            i = j
        return "".join(out), starts, ends


def normalize_text(text: str) -> tuple[str, list[int], list[int]]:
    """Normalise a whole text at once: ``(normalised, starts, ends)`` (offsets into ``text``)."""
    norm = Normalizer()
    a, s1, e1 = norm.push(text)
    b, s2, e2 = norm.flush()
    return a + b, s1 + s2, e1 + e2
