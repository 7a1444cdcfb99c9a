"""The [safety_filter] settings model and regex safety checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servehall_safety_filter.regex_safety import UnsafePatternError, check_pattern
from servehall_safety_filter.settings import SafetyFilterSettings
from servehall_safety_filter.testing import book


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(\w+\s?)*x", r"(?:x*y?)+z", r"((ab)*)+"])
def test_catastrophic_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(UnsafePatternError, match="catastrophic"):
        check_pattern(pattern)
    with pytest.raises(ValidationError, match="catastrophic"):
        SafetyFilterSettings(rules=[{"name": "r", "detector": "regex", "patterns": [pattern]}])


@pytest.mark.parametrize(
    ("pattern", "width"),
    [
        (r"abc", 3),
        (r"\d{3}-\d{4}", 8),
        (r"(?:ab){1,3}c", 7),
        (r"\w+", None),
        (r"a++", None),
        (r"ab(?=cd)(?!e)", 5),
        (r"(?<=xy)ab", 2),
        (r"a(?=\w+)", None),
    ],
)
def test_safe_patterns_report_their_width(pattern: str, width: int | None) -> None:
    assert check_pattern(pattern) == width


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(oops", "invalid regular expression"),
        (r"(a)b\1", "back-reference"),
        (r"(?P<x>a)(?P=x)", "back-reference"),
        ("(?i)abc", "global flags"),
        ("(?<=" + "x" * 40 + ")y", "looks behind more than 32"),
    ],
)
def test_invalid_regex_is_a_config_error(pattern: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SafetyFilterSettings(rules=[{"name": "r", "detector": "regex", "patterns": [pattern]}])


def test_unbounded_regex_window_uses_the_configured_cap() -> None:
    b = book(
        rules=[{"name": "r", "detector": "regex", "patterns": [r"secret\w*"]}],
        unbounded_match_chars=40,
    )
    assert b.default.output.window == 40
    b = book(
        rules=[{"name": "r", "detector": "regex", "patterns": [r"x\w*"], "max_match_chars": 9}]
    )
    assert b.default.output.window == 9


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {"rules": [{"name": "a", "keywords": ["x"]}, {"name": "a", "keywords": ["y"]}]},
            "duplicate",
        ),
        ({"rules": [{"name": "a"}]}, "needs keywords"),
        ({"rules": [{"name": "a", "detector": "regex"}]}, "needs patterns"),
        (
            {"rules": [{"name": "a", "detector": "national_id", "presets": ["zz"]}]},
            "unknown national_id",
        ),
        (
            {"rules": [{"name": "a", "keywords": ["x"]}], "policies": {"p": {"rules": ["b"]}}},
            "unknown rule",
        ),
        ({"policies": {"p": {"rules": []}}, "default_policy": "q"}, "unknown policy"),
        ({"tenant_policies": {"acme": "strict"}}, "unknown policy"),
        ({"rules": [{"name": "bad name!", "keywords": ["x"]}]}, "name"),
        ({"rules": [{"name": "a", "keywords": ["x"], "action": "delete"}]}, "action"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_errors(cfg: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SafetyFilterSettings(**cfg)


def test_unknown_contributed_detector_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="unknown detector 'toxicity'"):
        SafetyFilterSettings(rules=[{"name": "tox", "detector": "toxicity"}])
    with pytest.raises(ValueError, match="cannot be imported"):
        book(rules=[{"name": "tox", "detector": "no_such_module:Factory"}])


def test_defaults_have_no_rules() -> None:
    b = book()
    assert not b.has_input_rules and not b.has_output_rules
