"""``servehall.api.sampling``: an OpenAI request onto the engine's ``SamplingParams``
(one per choice), the decode budget, and the 400 for what the engine cannot honour."""

from __future__ import annotations

from typing import Any

import pytest

from servehall.api.sampling import (
    check_unsupported,
    resolve_max_tokens,
    sampling_params,
    set_fields,
)
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.errors import ContextLengthExceededError, UnsupportedParameterError
from servehall.structured.request import structured_request

_MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> tuple[dict[str, Any], ChatCompletionRequest]:
    body = {"model": "m", "messages": _MSGS, **fields}
    return body, ChatCompletionRequest.model_validate(body)


def completion(**fields: Any) -> tuple[dict[str, Any], CompletionRequest]:
    body = {"model": "m", "prompt": "p", **fields}
    return body, CompletionRequest.model_validate(body)


def _param(exc: pytest.ExceptionInfo[UnsupportedParameterError]) -> str | None:
    return exc.value.param


def test_set_fields_are_by_presence_not_truthiness() -> None:
    _, req = chat(temperature=0, top_p=None, seed=0)
    assert set_fields(req) == {"model": "m", "messages": req.messages, "temperature": 0, "seed": 0}


# --- check_unsupported ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"best_of": 2}, "best_of"),
    ],
)
def test_unimplemented_openai_fields_are_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    body, req = chat(**fields)
    with pytest.raises(UnsupportedParameterError) as err:
        check_unsupported(body, req, frozenset())
    assert _param(err) == param


def test_values_that_ask_for_nothing_pass_with_their_json_type() -> None:
    body, req = chat(logprobs=False, logit_bias={}, best_of=1, functions=[])
    check_unsupported(body, req, frozenset())
    body, creq = completion(logprobs=0)  # completions' 0 asks for one log-probability
    with pytest.raises(UnsupportedParameterError):
        check_unsupported(body, creq, frozenset())


def test_chat_only_fields_are_refused_on_completions_only() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body, req = completion(tools=tools)
    with pytest.raises(UnsupportedParameterError) as err:
        check_unsupported(body, req, frozenset())
    assert _param(err) == "tools" and "chat/completions" in str(err.value)
    body, req = completion(tool_choice="none")
    check_unsupported(body, req, frozenset())
    body, creq = chat(tools=tools)
    check_unsupported(body, creq, frozenset())


@pytest.mark.parametrize(
    "fields",
    [{"top_k": 5}, {"min_p": 0.1}, {"repetition_penalty": 1.2}, {"seed": 3}, {"top_p": 0.5}],
)
def test_an_optional_field_the_engine_lacks_is_refused_unless_supported(
    fields: dict[str, Any],
) -> None:
    (name,) = fields
    body, req = chat(**fields)
    with pytest.raises(UnsupportedParameterError) as err:
        check_unsupported(body, req, frozenset())
    assert _param(err) == name
    check_unsupported(body, req, frozenset({name}))


@pytest.mark.parametrize(
    "fields",
    [{"top_k": -1}, {"top_k": 0}, {"min_p": 0.0}, {"repetition_penalty": 1.0}, {"top_p": 1.0}],
)
def test_neutral_values_pass_without_support(fields: dict[str, Any]) -> None:
    body, req = chat(**fields)
    check_unsupported(body, req, frozenset())


def test_a_seed_with_greedy_decoding_needs_no_support() -> None:
    body, req = chat(seed=3, temperature=0)
    check_unsupported(body, req, frozenset())


def test_structured_output_needs_the_engines_support() -> None:
    body, req = chat(response_format={"type": "json_object"})
    sr = structured_request(body)
    with pytest.raises(UnsupportedParameterError) as err:
        check_unsupported(body, req, frozenset(), sr, backend="onnx")
    assert _param(err) == "response_format" and "(onnx)" in str(err.value)
    check_unsupported(body, req, frozenset({"structured_output"}), sr)


# --- resolve_max_tokens ----------------------------------------------------------------


def test_the_default_is_clipped_to_the_room_left() -> None:
    assert resolve_max_tokens(None, 10, 100, 16, "messages") == 16
    assert resolve_max_tokens(None, 95, 100, 16, "messages") == 5


def test_no_room_at_all_is_a_400_naming_the_prompt() -> None:
    with pytest.raises(ContextLengthExceededError) as err:
        resolve_max_tokens(None, 100, 100, 16, "messages")
    assert err.value.param == "messages"


def test_a_requested_budget_is_kept_or_refused() -> None:
    assert resolve_max_tokens(90, 10, 100, 16, "prompt") == 90
    with pytest.raises(ContextLengthExceededError) as err:
        resolve_max_tokens(91, 10, 100, 16, "prompt")
    assert err.value.param == "prompt" and "requested 101 tokens" in str(err.value)
    with pytest.raises(ContextLengthExceededError) as err:
        resolve_max_tokens(100, 1, 100, 16, "prompt")
    assert err.value.param == "max_tokens"


# --- sampling_params -------------------------------------------------------------------


def test_defaults() -> None:
    _, req = chat()
    (p,) = sampling_params(req, 1, 16, stop_token_ids=(2,))
    assert (p.max_tokens, p.temperature, p.top_p, p.seed) == (16, 1.0, 1.0, None)
    assert (p.top_k, p.min_p, p.repetition_penalty) == (0, 0.0, 1.0)
    assert (p.presence_penalty, p.frequency_penalty) == (0.0, 0.0)
    assert p.stop_token_ids == (2,) and not p.ignore_eos and p.structured is None


def test_each_choice_gets_the_next_seed_wrapping_at_2_64() -> None:
    _, req = chat(seed=2**64 - 2)
    assert [p.seed for p in sampling_params(req, 3, 8)] == [2**64 - 2, 2**64 - 1, 0]


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"temperature": 1e-6}, {"top_p": 0}])
def test_tiny_temperature_or_nucleus_is_greedy(fields: dict[str, Any]) -> None:
    _, req = chat(**fields)
    (p,) = sampling_params(req, 1, 8)
    assert (p.temperature, p.top_p) == (0.0, 1.0)


def test_fields_are_carried_and_top_k_minus_one_is_off() -> None:
    _, req = chat(
        temperature=0.7,
        top_p=0.9,
        top_k=-1,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
    )
    (p,) = sampling_params(req, 1, 8)
    assert (p.temperature, p.top_p, p.top_k) == (0.7, 0.9, 0)
    assert (p.min_p, p.repetition_penalty) == (0.05, 1.1)
    assert (p.presence_penalty, p.frequency_penalty) == (0.5, -0.5)


def test_ignore_eos_drops_the_models_stop_ids() -> None:
    _, req = completion(ignore_eos=True)
    (p,) = sampling_params(req, 1, 8, stop_token_ids=(2, 3))
    assert p.ignore_eos and p.stop_token_ids == ()
