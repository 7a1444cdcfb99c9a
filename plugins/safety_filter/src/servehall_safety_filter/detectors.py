"""Detectors: the built-in PII detectors, checksums, and the contributed-detector Protocol.

Built-in detectors are regular expressions over *normalised* text (see
:mod:`servehall_safety_filter.normalize`: lowercase, NFKC) plus a validator that
accepts, shortens or rejects each candidate (Luhn for payment cards, ISO 13616 mod-97
for IBANs, digit counts for phone numbers).

Another distribution can contribute a detector (e.g. a classifier model) without
importing this plugin: expose a factory under the entry-point group
:data:`DETECTOR_ENTRY_POINT_GROUP` that takes the rule's ``options`` table and returns
an object satisfying :class:`Detector`; a rule then names it with ``detector = "<name>"``
(or ``"package.module:factory"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

DETECTOR_ENTRY_POINT_GROUP = "servehall_safety_filter.detectors"
"""Entry-point group where other distributions register detector factories."""


@runtime_checkable
class Detector(Protocol):
    """A detector over normalised text, contributed by another plugin.

    Attributes:
        max_match_chars: the longest span (in normalised characters) :meth:`find` can
            report; it sizes the stream hold-back window, so keep it small (a
            classifier should judge windows of at most this many characters).

    Implementations must be thread-safe and fast: the stream filter calls :meth:`find`
    once per fed chunk of output text (per token) with a small range.
    """

    max_match_chars: int

    def find(self, text: str, start: int, stop: int) -> Iterable[tuple[int, int]]:
        """Report spans ``(s, e)`` of ``text`` with ``start <= s < stop`` and ``s < e``.

        ``text`` is normalised (NFKC, case-folded, zero-width characters removed,
        whitespace runs collapsed to one space). Characters outside ``[start, stop)`` are
        context: before ``start`` they were already judged; after ``stop`` at least
        ``max_match_chars`` characters follow unless the text has ended. Spans longer
        than ``max_match_chars`` may be cut at stream boundaries.
        """
        ...


Validator = Callable[[str, int, int], int | None]
"""``(text, start, end) -> accepted end (≤ end) or None`` for a regex candidate."""


def luhn_ok(digits: str) -> bool:
    """Luhn (mod 10) checksum of a digit string, as used by payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_IBAN_TABLE = (
    "AD:24 AE:23 AL:28 AT:20 AZ:28 BA:20 BE:16 BG:22 BH:22 BR:29 BY:28 CH:21 CR:22 "
    "CY:28 CZ:24 DE:22 DK:18 DO:28 EE:20 EG:29 ES:24 FI:18 FO:18 FR:27 GB:22 GE:22 "
    "GI:23 GL:18 GR:27 GT:28 HR:21 HU:28 IE:22 IL:23 IQ:23 IS:26 IT:27 JO:30 KW:30 "
    "KZ:20 LB:28 LC:32 LI:21 LT:20 LU:20 LV:21 MC:27 MD:24 ME:22 MK:19 MR:27 MT:31 "
    "MU:30 NL:18 NO:15 PK:24 PL:28 PS:29 PT:25 QA:29 RO:24 RS:22 SA:24 SC:31 SE:24 "
    "SI:19 SK:24 SM:27 ST:25 SV:28 TL:23 TN:24 TR:26 UA:29 VA:22 VG:24 XK:20"
)
_IBAN_LENGTHS = {item[:2]: int(item[3:]) for item in _IBAN_TABLE.split(" ")}
"""IBAN length by country (ISO 13616 registry); other countries: 15–34 characters."""


def iban_ok(iban: str) -> bool:
    """ISO 13616 check: the country's length (15–34 alphanumerics for countries not in
    the table), country letters, check digits, and mod-97 of the rearranged number
    equals 1. Spaces are ignored; case does not matter."""
    s = iban.replace(" ", "").upper()
    if not (15 <= len(s) <= 34 and s[:2].isalpha() and s[2:4].isdigit() and s.isalnum()):
        return False
    if _IBAN_LENGTHS.get(s[:2], len(s)) != len(s):
        return False
    moved = s[4:] + s[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


def _shrink(text: str, start: int, end: int, ok: Callable[[str], bool]) -> int | None:
    """Longest prefix of ``text[start:end]`` ending before a separator that passes ``ok``.

    Greedy candidate patterns can swallow a following group (``4111 … 1111 123``); this
    tries the whole candidate, then each shorter prefix that ends at a separator.
    """
    ends = [end] + [k for k in range(end - 1, start, -1) if text[k] in " -"]
    for e in ends:
        if e > start and ok(text[start:e]):
            return e
    return None


def _digits(s: str) -> str:
    return "".join(c for c in s if c.isdigit())


def validate_card(text: str, start: int, end: int) -> int | None:
    """Payment card: 13–19 digits passing Luhn (shortened to a separator if needed)."""

    def ok(s: str) -> bool:
        d = _digits(s)
        return 13 <= len(d) <= 19 and luhn_ok(d)

    return _shrink(text, start, end, ok)


def validate_iban(text: str, start: int, end: int) -> int | None:
    """IBAN: mod-97 valid (shortened to a space if the candidate swallowed a word)."""
    return _shrink(text, start, end, iban_ok)


def validate_phone(text: str, start: int, end: int) -> int | None:
    """Phone number: 7–15 digits, and a ``+``/parenthesis/``-``/``.`` or ≥ 10 digits
    (so space-separated plain numbers such as ``"2024 1000"`` are not phones)."""
    s = text[start:end]
    d = _digits(s)
    if not 7 <= len(d) <= 15:
        return None
    if s[0] in "+(" or "-" in s or "." in s or len(d) >= 10:
        return end
    return None


@dataclass(frozen=True, slots=True)
class BuiltinDetector:
    """A built-in detector: a pattern over normalised text and an optional validator."""

    pattern: str
    replacement: str
    max_match_chars: int | None = None  # None: the pattern's reach (exact in streams)
    validator: Validator | None = None


BUILTIN_DETECTORS: dict[str, BuiltinDetector] = {
    "email": BuiltinDetector(
        r"(?<![\w.%+-])[a-z0-9_%+-][a-z0-9._%+-]{0,63}@(?:[a-z0-9-]{1,63}\.){1,4}[a-z]{2,24}"
        r"(?![\w-])",
        "[EMAIL]",
        128,
    ),
    "phone": BuiltinDetector(
        r"(?<!\d[ .-])(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?"
        r"\d{2,4}(?:[ .-]?\d{2,4}){1,4}(?![\w])",
        "[PHONE]",
        None,
        validate_phone,
    ),
    "payment_card": BuiltinDetector(
        r"(?<![\d])(?:\d[ -]?){12,18}\d(?!\d)", "[CARD]", None, validate_card
    ),
    "iban": BuiltinDetector(
        r"(?<![a-z0-9])[a-z]{2}\d{2}(?: ?[a-z0-9]){11,30}(?![a-z0-9])",
        "[IBAN]",
        None,
        validate_iban,
    ),
}
"""Built-in PII detectors by name (patterns over lowercase normalised text)."""

NATIONAL_ID_PRESETS: dict[str, str] = {
    # US Social Security number (not 000/666/9xx area, 00 group, 0000 serial)
    "us_ssn": r"(?<!\d)(?!000|666|9\d\d)\d{3}[- ](?!00)\d{2}[- ](?!0000)\d{4}(?!\d)",
    # UK National Insurance number
    "uk_nino": r"(?<![a-z0-9])[a-ceghj-pr-tw-z][a-ceghj-npr-tw-z] ?\d{2} ?\d{2} ?\d{2} ?[a-d]"
    r"(?![a-z0-9])",
    # French NIR (social security number, 13 digits + 2-digit key)
    "fr_nir": r"(?<!\d)[12] ?\d{2} ?(?:0[1-9]|1[0-2]) ?(?:\d{2}|2a|2b) ?\d{3} ?\d{3} ?\d{2}(?!\d)",
}
"""National ID patterns selectable with ``presets = [...]`` in a ``national_id`` rule."""


def load_detector(spec: str, options: dict[str, Any]) -> Detector:
    """Build a contributed detector from an entry-point name or ``module:attr`` path.

    The target is a factory called with the rule's ``options`` table. Raises ValueError
    when it cannot be found, fails, or does not satisfy :class:`Detector`.
    """
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"detector {spec!r} cannot be imported: {exc}") from None
    else:
        eps = {ep.name: ep for ep in entry_points(group=DETECTOR_ENTRY_POINT_GROUP)}
        if spec not in eps:
            known = ", ".join(sorted([*BUILTIN_KINDS, *eps])) or "none"
            raise ValueError(f"unknown detector {spec!r} (known detectors: {known})")
        factory = eps[spec].load()
    try:
        detector = factory(options)
    except Exception as exc:
        raise ValueError(f"detector {spec!r} failed to start: {exc}") from None
    if not isinstance(detector, Detector):
        raise ValueError(f"detector {spec!r} does not implement max_match_chars and find()")
    return detector


BUILTIN_KINDS: tuple[str, ...] = ("keywords", "regex", "national_id", *BUILTIN_DETECTORS)
"""Detector names understood without any other plugin."""
