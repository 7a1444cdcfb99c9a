"""CPU cost of the safety filter per streamed token: 100 rules vs none, in one run.

Usage: ``python bench/bench_safety_filter.py [--tokens N]``

Streams a realistic English text (with a few e-mail addresses and numbers, no blocked
phrase) through one :class:`SafetyStreamFilter` per "choice", in ~4-character tokens as
a detokenizer produces them, and prints the process CPU time per token for:

* ``none``: no filter (what the host does when no output rule applies) — the loop cost;
* ``100 keyword rules``: 100 block rules of 3 phrases each (short hold-back window);
* ``100 mixed rules``: 85 keyword rules, 10 regex rules and the 5 PII detectors (e-mail,
  phone, payment card, IBAN, national IDs) — the e-mail detector sets a 129-char window.

The target is ≤ 10 µs per token for 100 rules. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from servehall_safety_filter.policy import PolicyBook
from servehall_safety_filter.settings import SafetyFilterSettings
from servehall_safety_filter.stream import SafetyStreamFilter

_PROSE = (
    "the model answers questions about serving large language models with continuous "
    "batching paged attention and a key value cache so that many requests share one "
    "accelerator while the scheduler keeps time to first token low and throughput high "
    "operators configure tenants policies and quotas then watch metrics dashboards"
)
WORDS = _PROSE.split(" ")


def make_text(rng: random.Random, n_chars: int) -> str:
    """Random prose with occasional PII-looking items (none blocked)."""
    out: list[str] = []
    size = 0
    while size < n_chars:
        r = rng.random()
        if r < 0.01:
            w = f"user{rng.randint(1, 999)}@example.com"
        elif r < 0.02:
            w = str(rng.randint(1000, 99999))
        else:
            w = rng.choice(WORDS)
        if rng.random() < 0.08:
            w += rng.choice([".", ",", "!", "\n\n"])
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def tokens_of(text: str, rng: random.Random) -> list[str]:
    """Cut text into 1–7 character pieces (mean ≈ 4), like detokenized tokens."""
    toks = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 7)
        toks.append(text[i : i + k])
        i += k
    return toks


def rule_set(kind: str, rng: random.Random) -> dict[str, Any]:
    """``[safety_filter]`` settings with 100 rules of the given kind."""
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word() -> str:
        return "".join(rng.choice(letters) for _ in range(rng.randint(5, 10)))

    n_kw = 100 if kind == "keywords" else 85
    rules: list[dict[str, Any]] = [
        {"name": f"kw{i}", "keywords": [word(), f"{word()} {word()}", word()]} for i in range(n_kw)
    ]
    if kind == "mixed":
        rules += [
            {"name": f"rx{i}", "detector": "regex", "patterns": [rf"zq{i}-\d{{4,8}}"]}
            for i in range(10)
        ]
        rules += [
            {"name": "email", "detector": "email", "action": "redact"},
            {"name": "phone", "detector": "phone", "action": "redact"},
            {"name": "card", "detector": "payment_card", "action": "redact"},
            {"name": "iban", "detector": "iban", "action": "redact"},
            {"name": "natid", "detector": "national_id", "presets": ["us_ssn"], "action": "flag"},
        ]
    return {"rules": rules}


def run(tokens: list[str], cfg: dict[str, Any] | None, choices: int) -> float:
    """CPU seconds per token streaming ``tokens`` ``choices`` times."""
    rules = PolicyBook(SafetyFilterSettings(**cfg)).default.output if cfg else None
    sent = 0
    t0 = time.process_time()
    for _ in range(choices):
        if rules is None:
            for tok in tokens:
                sent += len(tok)
            continue
        flt = SafetyStreamFilter(rules)
        for tok in tokens:
            sent += len(flt.feed(tok).text)
        sent += len(flt.finish().text)
    dt = time.process_time() - t0
    return dt / (len(tokens) * choices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000, help="tokens per choice")
    ap.add_argument("--choices", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    tokens = tokens_of(make_text(rng, args.tokens * 4), rng)[: args.tokens]
    mean = sum(map(len, tokens)) / len(tokens)
    print(f"{len(tokens)} tokens x {args.choices} choices, mean {mean:.2f} chars/token")
    for label, cfg in (
        ("none", None),
        ("100 keyword rules", rule_set("keywords", random.Random(1))),
        ("100 mixed rules (85 keyword, 10 regex, 5 PII)", rule_set("mixed", random.Random(2))),
    ):
        us = run(tokens, cfg, args.choices) * 1e6
        print(f"{label:50s} {us:7.2f} µs CPU per token")


if __name__ == "__main__":
    main()
