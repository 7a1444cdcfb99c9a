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
# what the general path treats one by one: whitespace runs and non-ASCII runs (the
# whitespace alternative first, so Unicode spaces collapse like ASCII ones)
_SPECIAL = re.compile(r"\s+|[^\x00-\x7f]+")
_WS_FIRST = frozenset(" \t\n\r\x0b\x0c")
_FOLD_CACHE: dict[str, str] = {}


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
        i = 0
        for m in _SPECIAL.finditer(s):
            a, b = m.span()
            if s[a] in _WS_FIRST or s[a].isspace():  # a whitespace run → one space
                if a > i:
                    self._ascii(s, i, a, base, out, starts, ends)
                if not self._last_space:
                    out.append(" ")
                    starts.append(base + a)  # the run's first character (the others
                    ends.append(base + a + 1)  # map to nothing, like ignorables)
                    self._last_space = True
            else:  # non-ASCII: per cluster; a leading combining mark joins the char before
                if a > i and unicodedata.combining(s[a]):
                    a -= 1
                if a > i:
                    self._ascii(s, i, a, base, out, starts, ends)
                self._clusters(s, a, b, base, out, starts, ends)
            i = b
        if i < len(s):
            self._ascii(s, i, len(s), base, out, starts, ends)
        return "".join(out), starts, ends

    def _ascii(
        self, s: str, i: int, j: int, base: int, out: list[str], st: list[int], en: list[int]
    ) -> None:
        """An ASCII run without whitespace: lowercase, one original char per char."""
        out.append(s[i:j].lower())
        st.extend(range(base + i, base + j))
        en.extend(range(base + i + 1, base + j + 1))
        self._last_space = False

    def _clusters(
        self, s: str, i: int, n: int, base: int, out: list[str], st: list[int], en: list[int]
    ) -> None:
        """Non-ASCII text ``s[i:n]``: fold each cluster (base char + combining marks)."""
        while i < n:
            j = i + 1
            while j < n and unicodedata.combining(s[j]):
                j += 1
            cluster = s[i:j]
            folded = _FOLD_CACHE.get(cluster)
            if folded is None:
                kept = "".join(c for c in cluster if not is_ignorable(c))
                folded = fold(kept) if kept else ""
                if len(_FOLD_CACHE) > 65536:
                    _FOLD_CACHE.clear()
                _FOLD_CACHE[cluster] = folded
            for ch in folded:
                if ch.isspace():
                    if self._last_space:
                        continue
                    ch = " "
                    self._last_space = True
                else:
                    self._last_space = False
                out.append(ch)
                st.append(base + i)
                en.append(base + j)
            i = j


def normalize_text(text: str) -> tuple[str, list[int], list[int]]:
    """Normalise a whole text at once: ``(normalised, starts, ends)`` (offsets into ``text``)."""
    norm = Normalizer()
    a, s1, e1 = norm.push(text)
    b, s2, e2 = norm.flush()
    return a + b, s1 + s2, e1 + e2


_WS_RUN = re.compile(r"\s+")


def normalized(text: str) -> str:
    """Just the normalised text of :func:`normalize_text` (no offset map; faster for ASCII)."""
    if text.isascii():
        return _WS_RUN.sub(" ", text).lstrip(" ").lower()
    return normalize_text(text)[0]
