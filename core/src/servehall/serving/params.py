"""Mapping an OpenAI request onto engine :class:`~servehall.engine.SamplingParams`.

``n > 1`` becomes ``n`` engine requests; choice ``i`` gets ``seed + i`` so choices differ
yet the whole request is reproducible. Optional fields an engine does not list in
``Engine.supported_params`` are refused with 400 ``unsupported_parameter`` naming the
field, when set to anything but their neutral value.
"""

from __future__ import annotations

from typing import Any

from servehall.api.models import UNSUPPORTED_FIELDS
from servehall.engine import SamplingParams
from servehall.errors import ContextLengthExceededError, UnsupportedParameterError

_NEUTRAL: dict[str, Any] = {
    "seed": None,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def check_unsupported(body: dict[str, Any], fields: Any, supported: frozenset[str]) -> None:
    """400 for a known-but-unimplemented OpenAI field, or an optional sampling field the
    engine cannot honour.

    Args:
        body: the raw JSON object (to see fields the model ignores).
        fields: the validated request (``seed``, ``top_p``, penalties).
        supported: ``Engine.supported_params``.
    """
    for name, off in UNSUPPORTED_FIELDS.items():
        if name in body and body[name] not in off:
            raise UnsupportedParameterError(
                f"'{name}' is not supported by this server.", param=name
            )
    greedy = getattr(fields, "temperature", None) == 0
    for name, neutral in _NEUTRAL.items():
        if name == "seed" and greedy:
            continue  # a seed changes nothing in greedy decoding
        value = getattr(fields, name, None)
        if value is not None and value != neutral and name not in supported:
            raise UnsupportedParameterError(
                f"'{name}' is not supported by this model's backend.", param=name
            )


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_model_len: int, default: int, param: str
) -> int:
    """The decode budget: ``requested`` or the server default clipped to the context.

    Raises ContextLengthExceededError (400) when prompt + max_tokens exceeds the context.
    """
    room = max_model_len - prompt_tokens
    if requested is None:
        if room < 1:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens; the "
                f"prompt has {prompt_tokens} tokens, leaving no room to generate.",
                param=param,
            )
        return min(default, room)
    if requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens; you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the "
            f"prompt, {requested} for the completion).",
            param="max_tokens" if requested >= max_model_len else param,
        )
    return requested


def sampling_params(
    fields: Any, n: int, max_tokens: int, stop_token_ids: tuple[int, ...] = ()
) -> list[SamplingParams]:
    """One :class:`SamplingParams` per choice (seed + i)."""
    temperature = 1.0 if fields.temperature is None else float(fields.temperature)
    top_p = 1.0 if fields.top_p is None else float(fields.top_p)
    if top_p == 0.0:  # OpenAI accepts 0: only the most likely token survives
        temperature, top_p = 0.0, 1.0
    seed = fields.seed
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=None if seed is None else (seed + i) % 2**64,
            presence_penalty=float(fields.presence_penalty or 0.0),
            frequency_penalty=float(fields.frequency_penalty or 0.0),
            stop_token_ids=stop_token_ids,
        )
        for i in range(n)
    ]
