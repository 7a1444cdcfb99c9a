"""``servehall.admission.usage``: an admission request's token estimate (what a token
rate limiter reserves)."""

from __future__ import annotations

from servehall.admission.principal import ANONYMOUS
from servehall.admission.usage import AdmissionRequest


def test_the_estimate_is_prompt_plus_max_tokens_per_choice() -> None:
    one = AdmissionRequest("r", "/v1/completions", "m", ANONYMOUS, prompt_tokens=10, max_tokens=5)
    assert (one.n, one.stream) == (1, False)
    assert one.token_estimate == 15
    three = AdmissionRequest(
        "r", "/v1/chat/completions", "m", ANONYMOUS, prompt_tokens=10, max_tokens=5, n=3
    )
    assert three.token_estimate == 25  # the prompt is counted once
