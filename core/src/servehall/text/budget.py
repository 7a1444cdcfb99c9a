"""Refusing a prompt that cannot fit the context *before* tokenizing it (case N31).

Tokenizing is the one request step whose cost grows with the prompt: a 2 MB prompt keeps
a fast tokenizer busy for seconds (servehall encodes with ``encode_batch`` on a worker
thread, which releases the GIL, so other streams go on — but the CPU is spent). Most such
prompts can be refused without tokenizing at all, from a safe lower bound on their token count:

    tokens(text) >= ceil(len(text) / max_token_chars)

where ``max_token_chars`` is the most characters one vocabulary entry can stand for
(the longest token string: a byte-level BPE entry of *k* symbols covers *k* bytes, so at
most *k* characters; a SentencePiece entry's symbols are characters). The bound only
holds for a tokenizer that loses no text — one whose normalizer and pre-tokenizer drop
nothing (BERT-style tokenizers drop whitespace and control characters, so 2 MB of
spaces may be zero tokens). :func:`max_token_chars` therefore checks that a probe text
with whitespace runs, control characters, combining marks, emoji and CJK survives an
encode/decode round trip unchanged, and answers None (no bound: tokenize) otherwise.

For a chat request the bound applies to the sum over message contents: the rendered
text holds every content and the template only adds characters, and the bound holds
for the whole text.
"""

from __future__ import annotations

import math
from typing import Any

from servehall.errors import ContextLengthExceededError

ROUND_TRIP_PROBE = "a  b\t\tc\n\n d\x00e\x01 e\u0301 \u00e9 \U0001f600 \u4e2d\u6587   "
"""Text whose encode/decode round trip shows that a tokenizer drops nothing."""


def max_token_chars(backend: Any) -> int | None:
    """The most characters one token of ``backend`` (a ``tokenizers.Tokenizer``) covers,
    or None when the tokenizer may drop text (then no lower bound is safe).

    Raises nothing: a tokenizer that cannot be inspected gives None.
    """
    try:
        ids = backend.encode(ROUND_TRIP_PROBE, add_special_tokens=False).ids
        if backend.decode(ids, skip_special_tokens=False) != ROUND_TRIP_PROBE:
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
    except Exception:
        return None
    longest = max((len(t) for t in vocab), default=0)
    return longest or None


def check_prompt_chars(
    chars: int, max_chars_per_token: int | None, max_model_len: int, param: str
) -> None:
    """Raise 400 ``context_length_exceeded`` when ``chars`` characters of content cannot
    fit ``max_model_len`` tokens with at least one token left to generate.

    Args:
        chars: characters of prompt content (the sum over a chat's messages).
        max_chars_per_token: :func:`max_token_chars` of the model's tokenizer; None
            disables the check.
        max_model_len: the model's context length in tokens.
        param: the request field named in the error (``messages`` / ``prompt``).

    Raises:
        ContextLengthExceededError: the lower bound on the token count exceeds
            ``max_model_len - 1``.
    """
    if not max_chars_per_token or chars <= max_model_len - 1:
        return
    at_least = math.ceil(chars / max_chars_per_token)
    if at_least > max_model_len - 1:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"your prompt has {chars} characters, which is at least {at_least} tokens. "
            "Please reduce the length of the prompt.",
            param=param,
        )
