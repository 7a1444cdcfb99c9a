"""``servehall.admission.filters``: the content-filter interface — verdict and result
defaults, prompts rewritten in place by a redacting filter, and the shipped safety
filter satisfying :class:`InputFilter` (and a stream filter :class:`OutputStreamFilter`)."""

from __future__ import annotations

import dataclasses

import pytest

from servehall.admission.filters import (
    FilterRecord,
    FilterVerdict,
    InputFilter,
    OutputStreamFilter,
    PromptParts,
    StreamFilterResult,
)


def test_defaults() -> None:
    v = FilterVerdict("flag")
    assert (v.rule, v.stage, v.count, v.monitor) == ("", "input", 1, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.count = 2  # type: ignore[misc]
    r = StreamFilterResult("text")
    assert (r.verdicts, r.blocked, r.consumed) == ((), False, None)
    assert FilterRecord().verdicts == [] and FilterRecord().verdicts is not FilterRecord().verdicts
    p = PromptParts(["a"], "/v1/completions", "m")
    assert p.principal is None


class Redact:
    name = "redact"

    def check(self, prompt: PromptParts) -> list[FilterVerdict]:
        hits = 0
        for i, text in enumerate(prompt.texts):
            if "secret" in text:
                prompt.texts[i] = text.replace("secret", "[X]")
                hits += text.count("secret")
        return [FilterVerdict("redact", "secret", count=hits)] if hits else []


class Upper:
    def feed(self, text: str) -> StreamFilterResult:
        return StreamFilterResult(text.upper())

    def finish(self) -> StreamFilterResult:
        return StreamFilterResult("")


def test_protocols_are_runtime_checkable() -> None:
    f = Redact()
    assert isinstance(f, InputFilter) and not isinstance(f, OutputStreamFilter)
    assert isinstance(Upper(), OutputStreamFilter) and not isinstance(Upper(), InputFilter)
    prompt = PromptParts(["a secret", "no", "secret secret"], "/v1/chat/completions", "m")
    [verdict] = f.check(prompt)
    assert prompt.texts == ["a [X]", "no", "[X] [X]"]
    assert verdict.count == 3 and verdict.action == "redact"


def test_the_safety_filter_plugin_implements_the_interface() -> None:
    pytest.importorskip("servehall_safety_filter")
    from servehall_safety_filter.input_filter import SafetyInputFilter
    from servehall_safety_filter.stream import SafetyStreamFilter

    for cls, proto in ((SafetyInputFilter, InputFilter), (SafetyStreamFilter, OutputStreamFilter)):
        for member in ("check",) if proto is InputFilter else ("feed", "finish"):
            assert callable(getattr(cls, member, None)), (cls, member)
