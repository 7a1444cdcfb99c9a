"""Mapping an OpenAI request onto engine :class:`~servehall.engines.contract.SamplingParams`.

``n > 1`` becomes ``n`` engine requests; choice ``i`` gets ``seed + i`` so choices differ
yet the whole request is reproducible.

"Set or not" is decided by presence, never by truthiness: a field is set when the client
sent it with a value other than null (``model_fields_set`` of the validated request, or
the raw body for fields the models do not carry). A set optional sampling field that the
model's engine does not list in ``Engine.supported_params`` is refused with 400
``unsupported_parameter`` naming the field, unless its value is the field's neutral value
(which asks the engine for nothing); nothing a client asks for is silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from servehall.api.wire import CHAT_ONLY_FIELDS, UNSUPPORTED_FIELDS, asks_for_nothing
from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.errors import ContextLengthExceededError, UnsupportedParameterError
from servehall.structured.request import StructuredRequest

#: Optional sampling fields an engine may or may not honour, with the values that ask for
#: nothing (``top_k`` -1 and 0 both mean "off", as in vLLM).
OPTIONAL_SAMPLING_FIELDS: dict[str, tuple[Any, ...]] = {
    "seed": (),
    "top_p": (1.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "top_k": (-1, 0),
    "min_p": (0.0,),
    "repetition_penalty": (1.0,),
}


GREEDY_TOP_P = 1e-6
"""A nucleus this small holds only the most likely token (its probability is at least
1/vocabulary), so ``top_p`` below it — 0 included, which OpenAI accepts — is greedy
decoding. Engines compute in float32, where ``5e-324`` would be 0 and refused."""
GREEDY_TEMPERATURE = 1e-5
"""Below this, softmax(logits / T) is argmax for any logits a model produces; engines
would see 0 (float32 underflow) and refuse to sample. Treated as greedy decoding."""


def set_fields(req: BaseModel) -> dict[str, Any]:
    """The fields of ``req`` the client sent with a non-null value (by presence)."""
    return {
        name: getattr(req, name)
        for name in req.model_fields_set
        if getattr(req, name, None) is not None
    }


def check_unsupported(
    body: dict[str, Any],
    fields: BaseModel,
    supported: frozenset[str],
    structured: StructuredRequest | None = None,
    backend: str = "",
) -> None:
    """400 for a known-but-unimplemented OpenAI field, a chat-only field (``tools`` …) on
    completions, an optional sampling field the engine cannot honour, or a decoding
    constraint on an engine without ``"structured_output"`` in its supported params.

    Args:
        body: the raw JSON object (to see fields the model ignores).
        fields: the validated request (``seed``, ``top_p``, penalties, ``top_k`` …).
        supported: ``Engine.supported_params``.
        structured: the request's checked constraint, if any.
        backend: the model's backend name (named in the structured-output refusal).

    Raises:
        UnsupportedParameterError: the first offending field, as ``param``.
    """
    for name, off in UNSUPPORTED_FIELDS.items():
        if name in body and not asks_for_nothing(body[name], off):
            raise UnsupportedParameterError(
                f"'{name}' is not supported by this server.", param=name
            )
    if not hasattr(fields, "messages"):
        for name, off in CHAT_ONLY_FIELDS.items():
            if name in body and not asks_for_nothing(body[name], off):
                raise UnsupportedParameterError(
                    f"'{name}' is only supported on /v1/chat/completions.", param=name
                )
    if structured is not None and "structured_output" not in supported:
        field = structured.param.split(".", 1)[0]
        which = f" ({backend})" if backend else ""
        raise UnsupportedParameterError(
            f"'{field}' (structured output) is not supported by this model's backend{which}.",
            param=field,
        )
    sent = set_fields(fields)
    greedy = sent.get("temperature") == 0
    for name, neutral in OPTIONAL_SAMPLING_FIELDS.items():
        if name not in sent or name in supported:
            continue
        if name == "seed" and greedy:
            continue  # a seed changes nothing in greedy decoding
        value = sent[name]
        if any(value == v for v in neutral):
            continue
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
    fields: Any,
    n: int,
    max_tokens: int,
    stop_token_ids: tuple[int, ...] = (),
    structured: StructuredConstraint | None = None,
) -> list[SamplingParams]:
    """One :class:`SamplingParams` per choice (seed + i); ``structured`` is every choice's
    decoding constraint (None = free text).

    ``stop_token_ids`` are the model's EOS ids (from its tokenizer and generation
    config); a request with ``ignore_eos`` gets none of them, so that every engine
    generates to ``max_tokens`` (the benchmarks' workload).
    """
    ignore_eos = bool(getattr(fields, "ignore_eos", False))
    if ignore_eos:
        stop_token_ids = ()
    temperature = 1.0 if fields.temperature is None else float(fields.temperature)
    top_p = 1.0 if fields.top_p is None else float(fields.top_p)
    top_k = 0 if fields.top_k is None else max(int(fields.top_k), 0)
    min_p = 0.0 if fields.min_p is None else float(fields.min_p)
    rep = 1.0 if fields.repetition_penalty is None else float(fields.repetition_penalty)
    if top_p < GREEDY_TOP_P or temperature < GREEDY_TEMPERATURE:
        temperature, top_p = 0.0, 1.0
    seed = fields.seed
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=None if seed is None else (seed + i) % 2**64,
            presence_penalty=0.0
            if fields.presence_penalty is None
            else float(fields.presence_penalty),
            frequency_penalty=0.0
            if fields.frequency_penalty is None
            else float(fields.frequency_penalty),
            stop_token_ids=stop_token_ids,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=rep,
            ignore_eos=ignore_eos,
            structured=structured,
        )
        for i in range(n)
    ]
