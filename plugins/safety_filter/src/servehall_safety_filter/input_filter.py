"""The input filter: every text part of a prompt, before tokenization."""

from __future__ import annotations

from collections import Counter as _Tally

from servehall import FilterVerdict, PromptParts
from servehall_safety_filter import metrics
from servehall_safety_filter.normalize import normalize_text, normalized
from servehall_safety_filter.policy import PolicyBook, tally_key, tally_verdicts
from servehall_safety_filter.redact import apply_spans, merge_spans


class SafetyInputFilter:
    """Input filter of the ``safety_filter`` plugin (an :class:`servehall.InputFilter`).

    For the principal's policy: if an enforced ``block`` rule matches any text part, the
    verdicts include that block (the host answers 400 ``content_filter`` naming the rule)
    and nothing is rewritten; otherwise enforced ``redact`` rules rewrite the matched
    spans of ``prompt.texts`` in place, and ``flag``/monitored rules are only recorded.
    Verdicts carry rule names and counts, never matched text.
    """

    name = "safety_filter"

    def __init__(self, book: PolicyBook) -> None:
        self.book = book

    def check(self, prompt: PromptParts) -> list[FilterVerdict]:
        """Inspect (and redact) ``prompt.texts``; return the verdicts (see the class doc)."""
        rules = self.book.for_principal(prompt.principal).input
        if not rules:
            return []
        tally: _Tally[tuple[str, str, bool]] = _Tally()
        texts = [normalized(t) for t in prompt.texts]
        blocked = False
        for norm in texts:
            for hit in rules.block.scan(norm, rules.block.cursor(), len(norm)):
                tally[tally_key(hit.rule)] += 1
                blocked = True
            for hit in rules.record.scan(norm, rules.record.cursor(), len(norm)):
                tally[tally_key(hit.rule)] += 1
        if rules.redact:
            for i, norm in enumerate(texts):
                hits = list(rules.redact.scan(norm, rules.redact.cursor(), len(norm)))
                for hit in hits:
                    tally[tally_key(hit.rule)] += 1
                if hits and not blocked:
                    _, starts, ends = normalize_text(prompt.texts[i])  # the offset map
                    spans = [(starts[h.start], ends[h.end - 1], h.rule.replacement) for h in hits]
                    prompt.texts[i] = apply_spans(prompt.texts[i], merge_spans(spans))
        verdicts = list(tally_verdicts(tally, "input"))
        metrics.count(verdicts)
        return verdicts
