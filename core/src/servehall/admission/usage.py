"""Admission requests and quota reservations (step 3: authorize + rate limit).

A rate limiter that counts tokens reserves ``prompt_tokens + max_tokens × n`` when a
request is admitted and settles to the real usage when it ends, so a rejected request
never consumes quota (OpenAI/LiteLLM-style token-per-minute limits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from servehall.admission.principal import Principal


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A validated, tokenized inference request about to be admitted.

    Attributes:
        request_id: id of the request (``chatcmpl-…`` / ``cmpl-…``).
        endpoint: ``/v1/chat/completions`` or ``/v1/completions``.
        model: model name.
        principal: the caller.
        prompt_tokens: tokens in the prompt.
        max_tokens: most completion tokens per choice.
        n: number of choices.
        stream: whether the response is streamed.
    """

    request_id: str
    endpoint: str
    model: str
    principal: Principal
    prompt_tokens: int
    max_tokens: int
    n: int = 1
    stream: bool = False

    @property
    def token_estimate(self) -> int:
        """Upper bound of tokens this request may use: prompt + max_tokens × n."""
        return self.prompt_tokens + self.max_tokens * self.n


@runtime_checkable
class Reservation(Protocol):
    """Quota held for one request; exactly one of settle/release is called."""

    async def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The request ran; charge the real usage instead of the estimate."""
        ...

    async def release(self) -> None:
        """The request was rejected after reserving (e.g. queue full); charge nothing."""
        ...

    def headers(self) -> dict[str, str]:
        """Response headers to add (e.g. ``x-ratelimit-remaining-requests``)."""
        ...
