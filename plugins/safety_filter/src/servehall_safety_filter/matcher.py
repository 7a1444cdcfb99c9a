"""Compiled rules and the multi-rule scanner over normalised text.

Rules of one policy and stage are split by effect into three :class:`RuleGroup` s —
enforced blocks, enforced redactions, and records (flags plus every rule of a monitored
policy) — and each group's regular-expression rules are compiled into ONE alternation
``(r0)|(r1)|…``; ``Match.lastindex`` tells which rule matched. One search per group and
fed chunk keeps the per-token cost independent of the number of rules, and grouping by
effect means a harmless match can never hide an overlapping block.

Within a group matching is leftmost-first and non-overlapping. When a validated
candidate (card, IBAN, phone) fails its check, the other rules of the group are tried
at the same position before the scan moves on one character.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from servehall_safety_filter.detectors import (
    BUILTIN_DETECTORS,
    NATIONAL_ID_PRESETS,
    Detector,
    Validator,
    load_detector,
)
from servehall_safety_filter.normalize import normalize_text
from servehall_safety_filter.regex_safety import check_pattern, pattern_width
from servehall_safety_filter.settings import Action, RuleSettings, SafetyFilterSettings


@dataclass(slots=True)
class CompiledRule:
    """One rule ready to match normalised text.

    Attributes:
        name: public rule name.
        action: configured action.
        monitor: True when the rule's policy runs in monitor mode.
        replacement: redaction text.
        source: regex source over normalised text ("" for a contributed detector).
        validator: accepts/shortens/rejects regex candidates.
        max_len: longest match in normalised characters (the stream window).
        detector: a contributed detector instead of a regex.
    """

    name: str
    action: Action
    monitor: bool
    replacement: str
    source: str = ""
    validator: Validator | None = None
    max_len: int = 1
    detector: Detector | None = None
    keywords: list[str] = field(default_factory=list)
    whole_word: bool = True
    pattern: re.Pattern[str] | None = field(default=None, repr=False)

    @property
    def effect(self) -> Literal["block", "redact", "record"]:
        """What the rule does to text: enforced block, enforced redaction, or record only."""
        if self.monitor or self.action == "flag":
            return "record"
        return self.action


@dataclass(frozen=True, slots=True)
class Hit:
    """A match ``[start, end)`` in normalised text by ``rule``."""

    start: int
    end: int
    rule: CompiledRule


def keyword_forms(keywords: list[str]) -> list[str]:
    """The normalised forms of a keyword list (empty ones dropped)."""
    return [f for f in (normalize_text(k)[0].strip() for k in keywords) if f]


def _trie_source(words: dict[str, str]) -> str:
    """A regex matching any of ``words`` (``{word: end_assertion}``), longest first.

    Words share prefixes in a trie, so matching at a position costs about the length
    of the longest keyword there, not the number of keywords.
    """
    root: dict[str, Any] = {}
    for word, end in words.items():
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node.setdefault("", end)

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if "" in node:
            alts.append(node[""])
        if len(alts) == 1:
            return alts[0]
        return "(?:" + "|".join(alts) + ")"

    return emit(root) if root else ""


def keywords_source(rules: list[tuple[list[str], bool]]) -> str:
    """One trie regex for every keyword of ``rules`` (``(forms, whole_word)`` pairs)."""
    bounded: dict[str, str] = {}
    free: dict[str, str] = {}
    for forms, whole_word in rules:
        for f in forms:
            end = r"(?!\w)" if whole_word and re.match(r"\w", f[-1]) else ""
            target = bounded if whole_word and re.match(r"\w", f[0]) else free
            target.setdefault(f, end)
    parts = []
    if bounded:
        parts.append(r"(?<!\w)" + _trie_source(bounded))
    if free:
        parts.append(_trie_source(free))
    return "|".join(parts)


def compile_rule(rs: RuleSettings, monitor: bool, cfg: SafetyFilterSettings) -> CompiledRule:
    """Turn a rule's settings into a :class:`CompiledRule` (ValueError on bad config)."""
    rule = CompiledRule(rs.name, rs.action, monitor, rs.default_replacement)
    width: int | None
    if rs.detector == "keywords":
        rule.keywords = keyword_forms(rs.keywords)
        rule.whole_word = rs.whole_word
        rule.source = keywords_source([(rule.keywords, rs.whole_word)])
        width = max(len(f) for f in rule.keywords)
    elif rs.detector in ("regex", "national_id"):
        pats = [f"(?i:{p})" for p in rs.patterns]
        pats += [NATIONAL_ID_PRESETS[p] for p in rs.presets]
        widths = [check_pattern(p) for p in pats]
        rule.source = "|".join(pats)
        width = None if None in widths else max(w for w in widths if w is not None)
    elif rs.detector in BUILTIN_DETECTORS:
        spec = BUILTIN_DETECTORS[rs.detector]
        rule.source, rule.validator = spec.pattern, spec.validator
        reach = pattern_width(spec.pattern)
        width = spec.max_match_chars if reach is None else reach
        if spec.max_match_chars is not None and width is not None:
            width = min(width, spec.max_match_chars)
    else:
        rule.detector = load_detector(rs.detector, rs.options)
        width = int(rule.detector.max_match_chars)
    if rs.max_match_chars is not None:
        width = rs.max_match_chars
    rule.max_len = max(1, min(width or cfg.unbounded_match_chars, cfg.max_window_chars))
    if rule.source:
        rule.pattern = re.compile(rule.source)
    return rule


class RuleGroup:
    """Rules with the same effect, scanned together (see the module docstring).

    Keyword rules share one trie regex (group 1 when there are keyword rules; the rule
    is found from the matched text), other regex rules follow as groups ``(r0)|(r1)|…``;
    contributed detectors run on their own. :meth:`scan` takes a mutable cursor per part
    so a stream can resume exactly where the previous chunk's scan stopped.
    """

    __slots__ = ("_by_index", "_keyword_rule", "detectors", "pattern", "rules")

    def __init__(self, rules: list[CompiledRule]) -> None:
        self.rules = rules
        kw_rules = [r for r in rules if r.keywords]
        rx_rules = [r for r in rules if r.pattern is not None and not r.keywords]
        self.detectors = [r for r in rules if r.detector is not None]
        self._keyword_rule: dict[str, CompiledRule] = {}
        for r in kw_rules:
            for f in r.keywords:
                self._keyword_rule.setdefault(f, r)
        self._by_index: dict[int, CompiledRule] = {}
        parts = []
        if kw_rules:  # group 1: every keyword, one trie
            parts.append(f"({keywords_source([(r.keywords, r.whole_word) for r in kw_rules])})")
        index = len(parts) + 1
        for r in rx_rules:
            assert r.pattern is not None
            self._by_index[index] = r
            index += 1 + r.pattern.groups
            parts.append(f"({r.source})")
        try:
            self.pattern = re.compile("|".join(parts)) if (kw_rules or rx_rules) else None
        except re.error as exc:  # e.g. a named group used by two rules
            raise ValueError(f"rules {[r.name for r in rules]} do not combine: {exc}") from None

    def __bool__(self) -> bool:
        return bool(self.rules)

    def cursor(self, pos: int = 0) -> list[int]:
        """A fresh scan cursor starting at ``pos`` (one slot per part)."""
        return [pos] * (1 + len(self.detectors))

    def _rule_of(self, m: re.Match[str]) -> CompiledRule:
        if m.lastindex == 1 and self._keyword_rule:
            return self._keyword_rule[m.group(1)]
        return self._by_index[m.lastindex or 0]

    def scan(self, text: str, cursor: list[int], stop: int) -> Iterator[Hit]:
        """Hits in ``text`` starting before ``stop``, from ``cursor`` on; moves the cursor.

        Leftmost-first and non-overlapping among the regex rules; each contributed
        detector on its own. When ``stop`` is the end of ``text`` the regex part uses
        a C-level search; otherwise (streams) it tries only positions ``< stop``, so a
        chunk costs time in proportion to the new text, not the held-back window.
        """
        pattern = self.pattern
        if pattern is not None:
            pos = cursor[0]
            whole = stop >= len(text)
            while pos < stop:
                if whole:
                    m = pattern.search(text, pos)
                    if m is None:
                        break
                else:
                    m = pattern.match(text, pos)
                    if m is None:
                        pos += 1
                        continue
                start, end = m.span()
                rule = self._rule_of(m)
                if rule.validator is not None:
                    accepted = rule.validator(text, start, end)
                    if accepted is None:
                        hit = self._retry(text, start, rule)
                        if hit is None:
                            pos = start + 1
                            continue
                        start, end, rule = hit.start, hit.end, hit.rule
                    else:
                        end = accepted
                if end <= start:  # an empty match: step over it
                    pos = start + 1
                    continue
                yield Hit(start, end, rule)
                pos = end
            cursor[0] = max(pos, stop)
        for i, rule in enumerate(self.detectors, 1):
            assert rule.detector is not None
            last = cursor[i]
            for s, e in rule.detector.find(text, cursor[i], stop):
                if s < cursor[i] or e <= s:
                    continue
                last = max(last, e)
                yield Hit(s, e, rule)
            cursor[i] = max(last, stop)

    def _retry(self, text: str, start: int, failed: CompiledRule) -> Hit | None:
        """After ``failed``'s validator rejected a candidate, try the others here."""
        for rule in self.rules:
            if rule is failed or rule.pattern is None:
                continue
            m = rule.pattern.match(text, start)
            if m is None:
                continue
            end: int | None = m.end()
            if rule.validator is not None:
                end = rule.validator(text, start, m.end())
            if end is not None and end > start:
                return Hit(start, end, rule)
        return None

    def shift(self, cursor: list[int], by: int) -> None:
        """Move ``cursor`` left by ``by`` after the text buffer dropped ``by`` chars."""
        for i in range(len(cursor)):
            cursor[i] -= by


@dataclass(slots=True)
class StageRules:
    """The compiled rules of one policy for one stage (input or output).

    Attributes:
        block / redact / record: the three effect groups.
        window: longest reach of an enforced (block/redact) rule, in normalised
            characters; the stream filter holds back ``window + 1`` characters of output
            (one more for look-ahead context), or nothing when no rule is enforced.
        record_window: the same for the record group, which judges text *after* it was
            sent and so never delays it.
    """

    block: RuleGroup
    redact: RuleGroup
    record: RuleGroup
    window: int
    record_window: int = 0

    @classmethod
    def build(cls, rules: list[CompiledRule]) -> StageRules:
        """Group ``rules`` by effect."""
        enforced = [r for r in rules if r.effect != "record"]
        recorded = [r for r in rules if r.effect == "record"]
        return cls(
            RuleGroup([r for r in enforced if r.effect == "block"]),
            RuleGroup([r for r in enforced if r.effect == "redact"]),
            RuleGroup(recorded),
            max((r.max_len for r in enforced), default=0),
            max((r.max_len for r in recorded), default=0),
        )

    @property
    def enforced(self) -> bool:
        """True when some rule can change the output (block or redact)."""
        return bool(self.block or self.redact)

    def __bool__(self) -> bool:
        return bool(self.block or self.redact or self.record)
