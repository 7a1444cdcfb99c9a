"""The output stream filter: incremental matching with a hold-back window.

Fed detokenized text piece by piece, the filter normalises only the new piece (keeping
an offset map to the original characters) and judges each normalised position once,
when it is *settled*: when at least ``window + 1`` normalised characters follow it
(``window`` = the longest reach of any block/redact rule of the policy; the extra character
is look-ahead context for word boundaries). A match starting at a settled position is
therefore complete, and matches are found exactly as in a scan of the whole text.

Original text is released only up to the first unsettled position, so a phrase split
across tokens or SSE chunks is caught before any part of it is sent:

* enforced **block** → the text before the match is released and the result has
  ``blocked=True`` (the host ends the choice with ``finish_reason: "content_filter"``
  and aborts the engine request); every later call returns nothing, blocked;
* every result that releases text states ``consumed``, the offset in the original text
  released up to (on a block, the start of the match): the host counts the completion
  tokens of that text only;
* enforced **redact** → the matched original characters are replaced by the rule's
  replacement; the release point moves past the whole match;
* **flag** and monitored rules → verdicts only. They never delay output: they judge
  text after it was sent (with their own window), so a policy in monitor mode streams
  exactly as fast as no policy.

Per fed chunk the work is the normalisation of the chunk plus one regex ``match`` per
newly settled position and effect group; the held-back window is not rescanned.
"""

from __future__ import annotations

from collections import Counter as _Tally

from servehall import FilterVerdict, StreamFilterResult
from servehall_safety_filter import metrics
from servehall_safety_filter.matcher import StageRules
from servehall_safety_filter.normalize import Normalizer
from servehall_safety_filter.policy import tally_key, tally_verdicts
from servehall_safety_filter.redact import apply_spans, merge_spans
from servehall_safety_filter.regex_safety import MAX_LOOKBEHIND

_EMPTY = StreamFilterResult("")
_BLOCKED = StreamFilterResult("", (), True)
_CONTEXT = MAX_LOOKBEHIND  # normalised characters kept before the cursors (look-behind)
_TRIM = 1024  # drop consumed buffer prefixes in steps of at least this many characters


class SafetyStreamFilter:
    """One choice's output filter (an :class:`servehall.OutputStreamFilter`).

    Args:
        rules: the principal's policy's compiled output rules.
    """

    __slots__ = (
        "_active",
        "_block_cur",
        "_blocked",
        "_done",
        "_ends",
        "_enforced",
        "_has_block",
        "_has_record",
        "_has_redact",
        "_hold",
        "_hold_rec",
        "_norm",
        "_raw",
        "_raw_base",
        "_record_cur",
        "_redact_cur",
        "_rules",
        "_settled",
        "_settled_rec",
        "_spans",
        "_starts",
        "_text",
    )

    def __init__(self, rules: StageRules) -> None:
        self._rules = rules
        self._enforced = rules.enforced
        self._has_block = bool(rules.block)
        self._has_redact = bool(rules.redact)
        self._has_record = bool(rules.record)
        self._hold = rules.window + 1 if self._enforced else 0
        self._hold_rec = rules.record_window + 1
        self._norm = Normalizer()
        self._text = ""  # normalised buffer
        self._starts: list[int] = []  # absolute original start per normalised char
        self._ends: list[int] = []  # absolute original end per normalised char
        self._raw = ""  # original text not yet released
        self._raw_base = 0  # absolute offset of _raw[0]
        self._settled = 0  # normalised positions < this were judged by block/redact rules
        self._settled_rec = 0  # … and by the record group
        self._block_cur = rules.block.cursor()
        self._redact_cur = rules.redact.cursor()
        self._record_cur = rules.record.cursor()
        self._active = [  # the cursors of non-empty groups (empty ones never move)
            cur
            for cur, group in (
                (self._block_cur, rules.block),
                (self._redact_cur, rules.redact),
                (self._record_cur, rules.record),
            )
            if group
        ]
        self._spans: list[tuple[int, int, str]] = []  # pending redactions (absolute)
        self._blocked = False
        self._done = False

    def feed(self, text: str) -> StreamFilterResult:
        """Take newly generated text; return what may be sent now (see the module doc)."""
        if self._blocked or self._done:
            return _BLOCKED if self._blocked else _EMPTY
        self._raw += text
        piece, starts, ends = self._norm.push(text)
        if piece:
            self._text += piece
            self._starts += starts
            self._ends += ends
        n = len(self._text)
        if (
            self._enforced
            and n - self._hold <= self._settled
            and (not self._has_record or n - self._hold_rec <= self._settled_rec)
        ):
            return _EMPTY  # nothing newly settled: hold everything
        return self._advance(final=False)

    def finish(self) -> StreamFilterResult:
        """The stream ended: judge and release (or block) everything held back."""
        if self._blocked or self._done:
            return _BLOCKED if self._blocked else _EMPTY
        piece, starts, ends = self._norm.flush()
        if piece:
            self._text += piece
            self._starts += starts
            self._ends += ends
        result = self._advance(final=True)
        self._done = True
        return result

    def _advance(self, final: bool) -> StreamFilterResult:
        text = self._text
        n = len(text)
        rules = self._rules
        tally: _Tally[tuple[str, str, bool]] | None = None
        if self._has_record:
            # flags and monitored rules only record: they judge text already sent
            rstop = n if final else n - self._hold_rec
            if rstop > self._settled_rec:
                for hit in rules.record.scan(text, self._record_cur, rstop):
                    tally = tally or _Tally()
                    tally[tally_key(hit.rule)] += 1
                self._settled_rec = rstop
        block = None
        if not self._enforced:
            release = self._raw_base + len(self._raw)  # nothing can change: send it all
        else:
            stop = n if final else n - self._hold
            if stop <= self._settled:
                release = self._raw_base
            else:
                if self._has_redact:
                    for hit in rules.redact.scan(text, self._redact_cur, stop):
                        tally = tally or _Tally()
                        tally[tally_key(hit.rule)] += 1
                        self._spans.append(
                            (
                                self._starts[hit.start],
                                self._ends[hit.end - 1],
                                hit.rule.replacement,
                            )
                        )
                if self._has_block:
                    for hit in rules.block.scan(text, self._block_cur, stop):
                        block = hit
                        break
                self._settled = stop
                # where original text may be released up to (absolute offset)
                if block is not None:
                    release = self._starts[block.start]
                elif final:
                    release = self._raw_base + len(self._raw)
                else:
                    release = self._starts[stop]
        spans = merge_spans(self._spans) if self._spans else []
        applied: list[tuple[int, int, str]] = []
        for s, e, rep in spans:
            if e <= self._raw_base:
                continue  # inside text already released redacted
            if s >= release:
                break
            if block is not None and e > release:
                release = s  # a redaction cut by the block: send neither
                break
            applied.append((max(s, self._raw_base), e, rep))
            release = max(release, e)
        release = max(release, self._raw_base)
        self._spans = [sp for sp in spans if sp[0] >= release]
        cut = release - self._raw_base
        out = apply_spans(self._raw[:cut], applied, self._raw_base) if applied else self._raw[:cut]
        self._raw = self._raw[cut:]
        self._raw_base = release
        self._trim()
        verdicts: tuple[FilterVerdict, ...] = tally_verdicts(tally, "output") if tally else ()
        if block is not None:
            self._blocked = True
            verdicts += (FilterVerdict("block", block.rule.name, "output", 1, False),)
        if verdicts:
            metrics.count(verdicts)
        if not out and not verdicts and block is None:
            return _EMPTY
        # consumed: the input released so far (original characters; a redaction's
        # replacement stands for the characters it replaced; on a block, the cut)
        return StreamFilterResult(out, verdicts, block is not None, consumed=release)

    def _trim(self) -> None:
        """Drop the judged prefix of the normalised buffer (amortised)."""
        settled = self._settled if self._enforced else self._settled_rec
        if settled - _CONTEXT < _TRIM:
            return  # cheap exit: nothing to drop yet
        low = min(
            settled,
            self._settled_rec if self._has_record else settled,
            *(p for cur in self._active for p in cur),
        )
        drop = low - _CONTEXT
        if drop < _TRIM:
            return
        self._text = self._text[drop:]
        del self._starts[:drop]
        del self._ends[:drop]
        self._settled -= drop
        self._settled_rec -= drop
        for cur in self._active:
            for i in range(len(cur)):
                cur[i] -= drop
