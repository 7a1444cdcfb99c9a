"""Tests of servehall.engines.torch.sampling: the per-request logits processor, on CPU
tensors and a stand-in for transformers' batch I/O (plain objects with the same fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from servehall import SamplingParams

torch = pytest.importorskip("torch")

from servehall.engines.torch.sampling import PerRequestSampler, _RequestSampling  # noqa: E402


def test_sampler_repetition_penalty_covers_prompt_and_output() -> None:
    scores = torch.tensor([[4.0, 3.0, -1.0, 1.0]])
    params = SamplingParams(4, temperature=0, repetition_penalty=2.0)
    # token 0 is in the prompt: 4.0 / 2 = 2.0 < 3.0 → token 1 would win, but it was
    # generated: 3.0 / 2 = 1.5 → token 0 (2.0) wins; token 2 (negative) is multiplied
    state = _RequestSampling(params, prompt_ids=(0,))
    PerRequestSampler._apply(state, [1], scores, row=0)
    assert int(torch.argmax(scores[0])) == 0


def test_sampler_applies_openai_penalties_to_one_row() -> None:
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0], [3.0, 2.5, 0.0, 1.0]])
    params = SamplingParams(4, temperature=0, frequency_penalty=0.4, presence_penalty=0.5)
    PerRequestSampler._apply(_RequestSampling(params), [0, 0], scores, row=1)
    # token 0: 3.0 - (2*0.4 + 0.5) = 1.7 < 2.5 → token 1 wins; the row becomes one-hot
    assert int(torch.argmax(scores[1])) == 1
    assert torch.isinf(scores[1][0]) and scores[1][1] == 0
    assert torch.equal(scores[0], torch.zeros(4))  # other rows untouched


def _sample(params: SamplingParams, logits: list[float], generated: list[int] | None = None) -> int:
    scores = torch.tensor([logits])
    PerRequestSampler._apply(_RequestSampling(params), generated or [], scores, row=0)
    row = scores[0]
    assert int((row == 0).sum()) == 1 and int(torch.isinf(row).sum()) == len(logits) - 1
    return int(torch.argmax(row))


def test_untouched_only_for_plain_greedy() -> None:
    assert _RequestSampling(SamplingParams(1, temperature=0)).untouched
    assert not _RequestSampling(SamplingParams(1, temperature=0.7)).untouched
    assert not _RequestSampling(SamplingParams(1, temperature=0, presence_penalty=0.1)).untouched
    assert not _RequestSampling(SamplingParams(1, temperature=0, frequency_penalty=-1)).untouched
    assert not _RequestSampling(SamplingParams(1, temperature=0, repetition_penalty=1.1)).untouched


def test_top_k_1_top_p_tiny_and_min_p_1_pick_the_argmax() -> None:
    logits = [0.1, 2.0, 1.9, -3.0]
    for seed in range(5):
        assert _sample(SamplingParams(1, temperature=1.0, top_k=1, seed=seed), logits) == 1
        assert _sample(SamplingParams(1, temperature=1.0, top_p=1e-6, seed=seed), logits) == 1
        assert _sample(SamplingParams(1, temperature=1.0, min_p=1.0, seed=seed), logits) == 1


def test_top_k_keeps_only_the_k_best() -> None:
    logits = [5.0, 4.9, -1.0, 4.8]
    picks = {
        _sample(SamplingParams(1, temperature=5.0, top_k=2, seed=s), logits) for s in range(40)
    }
    assert picks == {0, 1}


def test_top_p_keeps_the_smallest_set_over_the_mass() -> None:
    # probabilities ~ [0.5, 0.3, 0.2]; top_p 0.6 keeps tokens 0 and 1 (0.5 < 0.6 <= 0.8)
    import math

    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    picks = {
        _sample(SamplingParams(1, temperature=1.0, top_p=0.6, seed=s), logits) for s in range(60)
    }
    assert picks == {0, 1}


def test_min_p_drops_unlikely_tokens() -> None:
    import math

    # p = [0.6, 0.35, 0.05]; min_p 0.5 → threshold 0.3 keeps tokens 0 and 1
    logits = [math.log(0.6), math.log(0.35), math.log(0.05)]
    picks = {
        _sample(SamplingParams(1, temperature=1.0, min_p=0.5, seed=s), logits) for s in range(60)
    }
    assert picks == {0, 1}


def test_seed_makes_draws_reproducible_and_generator_persists() -> None:
    logits = torch.zeros(1, 50)
    params = SamplingParams(1, temperature=1.0, seed=1234)

    def draws() -> list[int]:
        state = _RequestSampling(params)
        out = []
        for _ in range(8):
            scores = logits.clone()
            PerRequestSampler._apply(state, [], scores, row=0)
            out.append(int(torch.argmax(scores[0])))
        return out

    first = draws()
    assert first == draws()
    assert len(set(first)) > 1  # the generator advances between steps, not re-seeded
    other = SamplingParams(1, temperature=1.0, seed=4321)
    state = _RequestSampling(other)
    seq = []
    for _ in range(8):
        scores = logits.clone()
        PerRequestSampler._apply(state, [], scores, row=0)
        seq.append(int(torch.argmax(scores[0])))
    assert seq != first


def test_penalties_ignore_out_of_vocab_ids() -> None:
    params = SamplingParams(1, temperature=0, frequency_penalty=1.0, repetition_penalty=2.0)
    state = _RequestSampling(params, prompt_ids=(99, -1))
    scores = torch.tensor([[1.0, 2.0]])
    PerRequestSampler._apply(state, [1, 1, 7], scores, row=0)
    # token 1: 2.0 / 2 (repetition) - 2 * 1.0 (frequency) = -1.0 < 1.0 → token 0
    assert int(torch.argmax(scores[0])) == 0


def test_repetition_penalty_multiplies_negative_logits() -> None:
    # token 0 (seen, negative) gets more negative: -1 * 3 = -3 < -2 → token 1 wins
    params = SamplingParams(1, temperature=0, repetition_penalty=3.0)
    assert _sample(params, [-1.0, -2.0], generated=[0]) == 1
    # without the penalty token 0 wins
    assert _sample(SamplingParams(1, temperature=0), [-1.0, -2.0], generated=[0]) == 0


# --- the processor over a batch ---------------------------------------------------------


@dataclass
class _State:
    request_id: str
    generated_tokens: list[int] = field(default_factory=list)


@dataclass
class _Future:
    state: _State
    has_new_token: bool = True


@dataclass
class _IO:
    requests_in_batch: list[_Future]
    logits_indices: Any


@dataclass
class _Processor:
    inputs_and_outputs: _IO


@dataclass
class _Manager:
    batch_processor: _Processor | None


def _bound(futures: list[_Future], rows: list[int]) -> PerRequestSampler:
    sampler = PerRequestSampler()
    io = _IO(futures, torch.tensor([*rows, 0, 0]))  # extra padding entries are ignored
    sampler.bind(_Manager(_Processor(io)))
    return sampler


def test_processor_maps_requests_to_their_rows() -> None:
    futures = [
        _Future(_State("greedy")),
        _Future(_State("skipped"), has_new_token=False),
        _Future(_State("penalised", [0])),
    ]
    sampler = _bound(futures, [2, 0])
    sampler.add("greedy", SamplingParams(1, temperature=0))
    sampler.add("penalised", SamplingParams(1, temperature=0, presence_penalty=2.0))
    scores = torch.tensor([[3.0, 2.0], [9.0, 9.0], [0.5, 1.0]])
    before = scores.clone()
    out = sampler(torch.zeros(1, 3, dtype=torch.long), scores)
    # "greedy" (row 2) is untouched; "penalised" (row 0): 3 - 2 = 1 < 2 → one-hot at 1
    assert torch.equal(out[2], before[2]) and torch.equal(out[1], before[1])
    assert out[0].tolist() == [float("-inf"), 0.0]


def test_processor_is_a_no_op_when_all_greedy_or_unbound() -> None:
    futures = [_Future(_State("a", [0]))]
    sampler = _bound(futures, [0])
    scores = torch.tensor([[3.0, 2.0]])
    assert torch.equal(sampler(torch.zeros(1), scores.clone()), scores)  # nothing registered
    sampler.add("a", SamplingParams(1, temperature=0))
    assert torch.equal(sampler(torch.zeros(1), scores.clone()), scores)  # greedy only
    unbound = PerRequestSampler()
    unbound.add("a", SamplingParams(1, temperature=0, presence_penalty=9.0))
    assert torch.equal(unbound(torch.zeros(1), scores.clone()), scores)  # no manager yet
    sampler.add("a", SamplingParams(1, temperature=0, presence_penalty=9.0))
    assert sampler(torch.zeros(1), scores.clone())[0].tolist() == [float("-inf"), 0.0]
    sampler.remove("a")
    sampler.remove("a")  # removing twice is harmless
    assert torch.equal(sampler(torch.zeros(1), scores.clone()), scores)


def test_prompt_ids_kept_only_with_repetition_penalty() -> None:
    sampler = PerRequestSampler()
    sampler.add("a", SamplingParams(1, temperature=0), prompt_ids=(1, 2))
    sampler.add("b", SamplingParams(1, temperature=0, repetition_penalty=1.2), prompt_ids=(1, 2))
    assert sampler._params["a"].prompt_ids == ()
    assert sampler._params["b"].prompt_ids == (1, 2)
