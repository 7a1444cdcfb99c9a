"""The ``[safety_filter]`` config section (validated at startup and by ``config check``).

Example::

    [safety_filter]
    default_policy = "standard"
    tenant_policies = { acme = "strict", beta = "trial" }

    [[safety_filter.rules]]
    name = "banned-terms"          # public name: shown to clients and in records
    detector = "keywords"
    keywords = ["forbidden phrase", "other term"]
    action = "block"

    [[safety_filter.rules]]
    name = "email"
    detector = "email"
    action = "redact"              # replaced by "[EMAIL]" unless `replacement` is set

    [safety_filter.policies.standard]
    rules = ["email"]
    [safety_filter.policies.strict]
    rules = ["banned-terms", "email"]
    [safety_filter.policies.trial]
    rules = ["banned-terms"]
    mode = "monitor"               # record verdicts only, enforce nothing

When ``policies`` is empty, one implicit policy named ``default_policy`` holds every rule.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servehall_safety_filter.detectors import (
    BUILTIN_DETECTORS,
    BUILTIN_KINDS,
    DETECTOR_ENTRY_POINT_GROUP,
    NATIONAL_ID_PRESETS,
)
from servehall_safety_filter.regex_safety import UnsafePatternError, check_pattern

Action = Literal["block", "redact", "flag"]
Stage = Literal["input", "output"]
_BOTH: tuple[Stage, ...] = ("input", "output")


class RuleSettings(BaseModel):
    """One rule: a detector, what to do on a match, and where it applies.

    Attributes:
        name: public rule name (in 400 errors, verdicts, metrics); never the matched text.
        detector: ``keywords`` | ``regex`` | ``email`` | ``phone`` | ``payment_card`` |
            ``iban`` | ``national_id`` | a contributed detector (entry-point name in group
            ``servehall_safety_filter.detectors`` or ``module:factory``).
        action: ``block`` | ``redact`` | ``flag`` (allow and record).
        stages: ``input`` (prompts) and/or ``output`` (generated text).
        keywords: words/phrases for ``keywords`` (matched normalised, whole words by
            default; a space matches any whitespace run).
        whole_word: for ``keywords``: only match at word boundaries.
        patterns: regular expressions for ``regex`` and extra ones for ``national_id``
            (matched case-insensitively against normalised text).
        presets: ``national_id`` presets: ``us_ssn``, ``uk_nino``, ``fr_nir``.
        replacement: redaction text (default ``[EMAIL]``, ``[PHONE]``, … or ``[REDACTED]``).
        max_match_chars: longest match considered in streams (sizes the hold-back window);
            required sense for unbounded regexes, defaults to the section's
            ``unbounded_match_chars``.
        options: free table passed to a contributed detector's factory.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    detector: str = "keywords"
    action: Action = "block"
    stages: list[Stage] = Field(default_factory=lambda: list(_BOTH), min_length=1)
    keywords: list[str] = Field(default_factory=list)
    whole_word: bool = True
    patterns: list[str] = Field(default_factory=list)
    presets: list[str] = Field(default_factory=list)
    replacement: str | None = None
    max_match_chars: int | None = Field(default=None, ge=1, le=4096)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> RuleSettings:
        d = self.detector
        if d not in BUILTIN_KINDS and ":" not in d:
            contributed = {ep.name for ep in entry_points(group=DETECTOR_ENTRY_POINT_GROUP)}
            if d not in contributed:
                known = ", ".join([*BUILTIN_KINDS, *sorted(contributed)])
                raise ValueError(f"rule {self.name!r}: unknown detector {d!r} (known: {known})")
        if d == "keywords" and not [k for k in self.keywords if k.strip()]:
            raise ValueError(f"rule {self.name!r}: detector 'keywords' needs keywords")
        if d == "regex" and not self.patterns:
            raise ValueError(f"rule {self.name!r}: detector 'regex' needs patterns")
        if d == "national_id":
            if not (self.patterns or self.presets):
                raise ValueError(f"rule {self.name!r}: national_id needs presets or patterns")
            unknown = [p for p in self.presets if p not in NATIONAL_ID_PRESETS]
            if unknown:
                known = ", ".join(sorted(NATIONAL_ID_PRESETS))
                raise ValueError(
                    f"rule {self.name!r}: unknown national_id preset(s) {unknown} (known: {known})"
                )
        if d in ("regex", "national_id"):
            for pattern in self.patterns:
                try:
                    check_pattern(pattern)
                    check_pattern(f"(?i:{pattern})")  # as compiled: scoped flags only
                except UnsafePatternError as exc:
                    raise ValueError(f"rule {self.name!r}: {exc}") from None
        elif self.patterns:
            raise ValueError(f"rule {self.name!r}: patterns only apply to regex/national_id")
        if self.keywords and d != "keywords":
            raise ValueError(f"rule {self.name!r}: keywords only apply to detector 'keywords'")
        return self

    @property
    def default_replacement(self) -> str:
        """What a redaction writes when ``replacement`` is unset."""
        if self.replacement is not None:
            return self.replacement
        if self.detector in BUILTIN_DETECTORS:
            return BUILTIN_DETECTORS[self.detector].replacement
        if self.detector == "national_id":
            return "[NATIONAL_ID]"
        return "[REDACTED]"


class PolicySettings(BaseModel):
    """A named rule set.

    Attributes:
        rules: names of rules (from ``[[safety_filter.rules]]``) in this set.
        mode: ``enforce`` or ``monitor`` (verdicts recorded with ``monitor=true``,
            nothing blocked or rewritten) — run a new rule set this way first.
    """

    model_config = ConfigDict(extra="forbid")

    rules: list[str] = Field(default_factory=list)
    mode: Literal["enforce", "monitor"] = "enforce"


class SafetyFilterSettings(BaseModel):
    """The ``[safety_filter]`` section.

    Attributes:
        default_policy: policy for principals without a tenant or with an unmapped one.
        tenant_policies: ``{tenant: policy}`` (tenant from the authenticated principal).
        rules: every rule, referenced by name from policies.
        policies: named rule sets; empty means one policy ``default_policy`` = all rules.
        unbounded_match_chars: stream window for regexes without a longest match.
        max_window_chars: upper bound of any rule's window (hold-back in characters).
    """

    model_config = ConfigDict(extra="forbid")

    default_policy: str = "default"
    tenant_policies: dict[str, str] = Field(default_factory=dict)
    rules: list[RuleSettings] = Field(default_factory=list)
    policies: dict[str, PolicySettings] = Field(default_factory=dict)
    unbounded_match_chars: int = Field(default=128, ge=1, le=4096)
    max_window_chars: int = Field(default=512, ge=1, le=4096)

    @model_validator(mode="after")
    def _check(self) -> SafetyFilterSettings:
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate rule name(s): {', '.join(dupes)}")
        if self.policies:
            known = set(names)
            for pname, policy in self.policies.items():
                missing = [r for r in policy.rules if r not in known]
                if missing:
                    raise ValueError(f"policy {pname!r} names unknown rule(s): {missing}")
            wanted = {self.default_policy, *self.tenant_policies.values()}
            absent = sorted(p for p in wanted if p not in self.policies)
            if absent:
                raise ValueError(
                    f"unknown policy name(s) {absent} (defined: {sorted(self.policies)})"
                )
        else:
            bad = sorted(p for p in self.tenant_policies.values() if p != self.default_policy)
            if bad:
                raise ValueError(f"unknown policy name(s) {bad}: define [safety_filter.policies]")
        return self

    def effective_policies(self) -> dict[str, PolicySettings]:
        """Policies by name, with the implicit all-rules default when none are defined."""
        if self.policies:
            return dict(self.policies)
        return {self.default_policy: PolicySettings(rules=[r.name for r in self.rules])}
