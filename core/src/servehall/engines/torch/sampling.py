"""Per-request sampling inside transformers' continuous-batching step.

transformers' manager takes one ``GenerationConfig`` for all requests, so its own
sampling cannot honour per-request ``temperature``/``top_p``/``seed``/penalties. We run it
greedy (``do_sample=False``: argmax) and add :class:`PerRequestSampler` to its logits
processors: for each request that gets a token this step, the sampler applies the
request's repetition penalty (over prompt and output, as Hugging Face and vLLM do), OpenAI
penalties, temperature, top-k, min-p and nucleus (top-p) filters, draws the token with
the request's own ``torch.Generator`` and rewrites that row to a one-hot (0 at the chosen
id, -inf elsewhere), so the manager's argmax picks exactly the sampled token. Greedy
requests without penalties are left untouched (bit-identical to plain argmax).

Runs on the manager's step thread. Needs the synchronous batch I/O (no CUDA graphs, no
async double-buffering): the engine configures the manager that way.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any

import torch

from servehall.engines.contract import SamplingParams


@dataclass(slots=True)
class _RequestSampling:
    params: SamplingParams
    prompt_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None
    matcher: Any = None  # xgrammar GrammarMatcher of a constrained request
    bitmask: Any = None
    accepted: int = 0  # generated tokens the matcher has consumed

    @property
    def untouched(self) -> bool:
        p = self.params
        return (
            self.matcher is None
            and p.temperature == 0
            and p.presence_penalty == 0
            and p.frequency_penalty == 0
            and p.repetition_penalty == 1.0
        )


def _mask(state: _RequestSampling, generated: list[int], logits: torch.Tensor) -> None:
    """Advance the request's grammar matcher over its new tokens and mask ``logits``
    (``[vocab]``) to the tokens the grammar allows next."""
    import xgrammar as xgr

    matcher = state.matcher
    for token in generated[state.accepted :]:
        if not matcher.accept_token(int(token)):
            break  # cannot happen for masked samples; the mask below still holds
    state.accepted = len(generated)
    if matcher.is_terminated():
        return
    matcher.fill_next_token_bitmask(state.bitmask)
    vocab = logits.shape[0]
    xgr.apply_token_bitmask_inplace(
        logits.view(1, vocab), state.bitmask.to(logits.device), vocab_size=vocab
    )


class PerRequestSampler:
    """A logits processor ``(input_ids, scores) -> scores`` for the manager's step.

    ``scores`` is ``[num_query_tokens, vocab]``; the row of the k-th request that gets a new
    token is ``logits_indices[k]`` of the batch I/O (requests in batch order).
    """

    def __init__(self) -> None:
        self._params: dict[str, _RequestSampling] = {}
        self._lock = threading.Lock()
        self._batch_io: Any = None
        self._manager: Any = None

    def bind(self, manager: Any) -> None:
        """Attach to a started ``ContinuousBatchingManager`` (reads its batch I/O)."""
        self._manager = manager

    def add(
        self,
        request_id: str,
        params: SamplingParams,
        prompt_ids: tuple[int, ...] = (),
        grammar: Any = None,
    ) -> None:
        """Register a request's sampling parameters (before it is queued); ``prompt_ids``
        are what ``repetition_penalty`` covers besides the generated tokens; ``grammar``
        is an xgrammar ``CompiledGrammar`` whose token mask every step of the request
        applies before sampling (xgrammar's ``fill_next_token_bitmask`` +
        ``apply_token_bitmask_inplace``)."""
        state = _RequestSampling(
            params, tuple(prompt_ids) if params.repetition_penalty != 1.0 else ()
        )
        if grammar is not None:
            import xgrammar as xgr

            state.matcher = xgr.GrammarMatcher(grammar)
            state.bitmask = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
        with self._lock:
            self._params[request_id] = state

    def remove(self, request_id: str) -> None:
        """Forget a finished or aborted request."""
        with self._lock:
            self._params.pop(request_id, None)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        with self._lock:
            if not self._params or all(s.untouched for s in self._params.values()):
                return scores
            params = dict(self._params)
        processor = getattr(self._manager, "batch_processor", None)
        if processor is None:
            return scores
        io = processor.inputs_and_outputs
        futures = [fs for fs in io.requests_in_batch if fs.has_new_token]
        if not futures:
            return scores
        rows = io.logits_indices[: len(futures)].tolist()
        for fs, row in zip(futures, rows, strict=True):
            state = params.get(fs.state.request_id)
            if state is None or state.untouched:
                continue
            self._apply(state, fs.state.generated_tokens, scores, int(row))
        return scores

    @staticmethod
    def _apply(
        state: _RequestSampling, generated: list[int], scores: torch.Tensor, row: int
    ) -> None:
        p = state.params
        logits = scores[row].float()
        if state.matcher is not None:
            _mask(state, generated, logits)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(state.prompt_ids).union(generated)),
                dtype=torch.long,
                device=logits.device,
            )
            seen = seen[(seen >= 0) & (seen < logits.shape[0])]
            if seen.numel():
                picked = logits[seen]
                logits[seen] = torch.where(
                    picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty
                )
        if (p.presence_penalty or p.frequency_penalty) and generated:
            ids, counts = torch.unique(
                torch.tensor(generated, device=logits.device), return_counts=True
            )
            valid = (ids >= 0) & (ids < logits.shape[0])
            ids, counts = ids[valid], counts[valid]
            logits[ids] -= counts.to(logits.dtype) * p.frequency_penalty + p.presence_penalty
        if p.temperature == 0:
            choice = int(torch.argmax(logits))
        else:
            logits = logits / p.temperature
            if 0 < p.top_k < logits.shape[0]:
                kth = torch.topk(logits, p.top_k).values[-1]
                logits[logits < kth] = float("-inf")
            if p.min_p > 0.0:
                probs = torch.softmax(logits, dim=-1)
                logits[probs < p.min_p * probs.max()] = float("-inf")
            if p.top_p < 1.0:
                sorted_logits, order = torch.sort(logits, descending=True)
                cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
                drop = cum - torch.softmax(sorted_logits, dim=-1) >= p.top_p
                drop[0] = False
                logits[order[drop]] = float("-inf")
            probs = torch.softmax(logits, dim=-1)
            if state.generator is None:
                gen = torch.Generator(device=logits.device)
                gen.manual_seed(p.seed if p.seed is not None else secrets.randbits(63))
                state.generator = gen
            choice = int(torch.multinomial(probs, 1, generator=state.generator))
        out = scores[row]
        out.fill_(float("-inf"))
        out[choice] = 0.0
