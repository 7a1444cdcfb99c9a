"""Servehall's request parameters as vLLM's: :func:`vllm_sampling_params` (every
sampling field, delta outputs, no detokenization; vLLM is imported inside each call).

Structured output (:class:`~servehall.StructuredConstraint`) maps one to one onto vLLM's
``StructuredOutputsParams`` (``json``, ``regex``, ``choice``, ``grammar``,
``structural_tag``), compiled by vLLM's xgrammar backend. Length-bounded strings of a
schema are first rewritten into JSON-safe patterns
(:func:`servehall.structured.json_text.json_safe_lengths`) and its "any JSON" values
(``json_object``'s) get the numbers bounds of a schema node
(:func:`servehall.structured.json_text.bounded_any_values`). The whitespace bound is
engine-level: vLLM 0.32's grammar backends read ``disable_any_whitespace`` only from
the engine's ``structured_outputs_config`` (the per-request field of
``StructuredOutputsParams`` is never read), so the engine starts with
:func:`structured_outputs_config` (backend ``xgrammar``, which that setting requires,
and ``disable_any_whitespace=True``: compact JSON, no whitespace between tokens) and a
request cannot lift it (``structured_outputs.disable_any_whitespace: false`` still gets
compact JSON on vLLM).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.structured.json_text import (
    bounded_any_values,
    json_safe_lengths,
    json_safe_structural_tag,
)


def vllm_sampling_params(params: SamplingParams, eos_token_ids: Sequence[int]) -> Any:
    """Our :class:`~servehall.SamplingParams` as vLLM's (delta outputs, no detokenization).

    Every field maps: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (0 = off: vLLM's
    -1/0), ``min_p``, ``seed``, ``presence_penalty``, ``frequency_penalty``,
    ``repetition_penalty``, ``max_tokens``, ``ignore_eos``, ``stop_token_ids`` (plus the
    model's EOS ids, since vLLM cannot read them without its tokenizer) and
    ``structured`` (:func:`structured_outputs`). ``n`` is always 1: the host expands it.

    Raises:
        ValueError: vLLM refused a value (its own validation).
    """
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    stops = list(params.stop_token_ids)
    if not params.ignore_eos:
        stops += [t for t in eos_token_ids if t not in stops]
    return VSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        min_p=params.min_p,
        seed=params.seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        stop_token_ids=stops,
        structured_outputs=structured_outputs(params.structured),
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        skip_special_tokens=False,
    )


def structured_outputs(constraint: StructuredConstraint | None) -> Any:
    """``constraint`` as vLLM's ``StructuredOutputsParams`` (None for free text):
    ``json_schema`` → ``json`` (the schema's JSON text; length-bounded strings as
    JSON-safe patterns, "any JSON" values with bounded numbers:
    :mod:`servehall.structured.json_text`), ``regex``, ``choice`` (a list), ``grammar``,
    ``structural_tag`` (its tags' schemas likewise). ``disable_any_whitespace`` is set
    too, for a vLLM that reads it per request; 0.32 reads only
    :func:`structured_outputs_config`'s."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(
        json=(
            json.dumps(bounded_any_values(json_safe_lengths(json.loads(constraint.json_schema))))
            if constraint.json_schema is not None
            else None
        ),
        regex=constraint.regex,
        choice=list(constraint.choice) if constraint.choice is not None else None,
        grammar=constraint.grammar,
        structural_tag=(
            json_safe_structural_tag(constraint.structural_tag)
            if constraint.structural_tag is not None
            else None
        ),
        disable_any_whitespace=not constraint.any_whitespace,
    )


def structured_outputs_config() -> Any:
    """vLLM's engine-level ``StructuredOutputsConfig``: backend ``xgrammar`` (our schema
    checks follow xgrammar's limits; ``disable_any_whitespace`` is refused with
    ``auto``) and ``disable_any_whitespace=True``, the whitespace bound of every
    constrained request (see the module docstring)."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
