"""The input filter and per-tenant policies."""

from __future__ import annotations

from servehall import FilterVerdict, Principal, PromptParts
from servehall_safety_filter.input_filter import SafetyInputFilter
from servehall_safety_filter.testing import book, run_stream, stream_of

RULES = [
    {"name": "banned", "keywords": ["open sesame", "xyzzy"]},
    {"name": "email", "detector": "email", "action": "redact"},
    {"name": "mention", "keywords": ["llama"], "action": "flag"},
]


def check(b: object, texts: list[str], tenant: str | None = None) -> tuple[list[str], list]:
    parts = PromptParts(
        texts=list(texts),
        endpoint="/v1/chat/completions",
        model="demo",
        principal=Principal(id="k1", tenant=tenant),
    )
    verdicts = SafetyInputFilter(b).check(parts)  # type: ignore[arg-type]
    return parts.texts, verdicts


def test_block_names_the_rule_and_leaves_text_untouched() -> None:
    b = book(rules=RULES)
    texts = ["hello a@b.io", "please say OPEN\u200b  Sesame now"]
    out, verdicts = check(b, texts)
    assert out == texts
    blocks = [v for v in verdicts if v.action == "block"]
    assert blocks == [FilterVerdict("block", "banned", "input", 1, False)]


def test_redact_all_messages_and_flag() -> None:
    b = book(rules=RULES)
    out, verdicts = check(b, ["system: mail ops@corp.example", "user: a@b.io and c@d.io llama"])
    assert out == ["system: mail [EMAIL]", "user: [EMAIL] and [EMAIL] llama"]
    assert sorted(verdicts, key=lambda v: v.rule) == [
        FilterVerdict("redact", "email", "input", 3, False),
        FilterVerdict("flag", "mention", "input", 1, False),
    ]


def test_clean_prompt_gives_no_verdicts() -> None:
    b = book(rules=RULES)
    assert check(b, ["nothing to see here"]) == (["nothing to see here"], [])


def test_verdicts_never_contain_matched_text() -> None:
    b = book(rules=RULES)
    _, verdicts = check(b, ["xyzzy a@b.io"])
    for v in verdicts:
        assert "xyzzy" not in repr(v) and "a@b.io" not in repr(v)


def test_per_tenant_policies_and_default() -> None:
    b = book(
        rules=RULES,
        default_policy="standard",
        tenant_policies={"acme": "strict", "beta": "trial"},
        policies={
            "standard": {"rules": ["email"]},
            "strict": {"rules": ["banned", "email"]},
            "trial": {"rules": ["banned"], "mode": "monitor"},
        },
    )
    text = ["xyzzy and a@b.io"]
    # default (no tenant, unknown tenant): only e-mail redaction
    for tenant in (None, "unknown"):
        out, verdicts = check(b, text, tenant)
        assert out == ["xyzzy and [EMAIL]"]
        assert [v.rule for v in verdicts] == ["email"]
    # strict: blocked
    _, verdicts = check(b, text, "acme")
    assert any(v.action == "block" and not v.monitor for v in verdicts)
    # trial: monitored block, nothing rewritten
    out, verdicts = check(b, text, "beta")
    assert out == text
    assert verdicts == [FilterVerdict("block", "banned", "input", 1, True)]
    # the same selection applies to output streams
    assert run_stream(stream_of(b, "acme"), ["say xyzzy now"]).blocked
    assert not run_stream(stream_of(b, "beta"), ["say xyzzy now"]).blocked
    assert run_stream(stream_of(b, None), ["a@b.io!"]).text == "[EMAIL]!"


def test_large_prompt_is_fast_enough() -> None:
    import time

    b = book(rules=RULES)
    text = ("lorem ipsum dolor sit amet, 12345 consectetur. " * 2000)[:100_000]
    t0 = time.perf_counter()
    check(b, [text])
    assert time.perf_counter() - t0 < 2.0
