"""Benchmark workloads: which prompts are sent, how long the answers are, and when.

Datasets (vLLM's ``--dataset-name`` idea):

* ``random``: prompts of ``input_len`` tokens (``± range_ratio``) built from English
  words and cut to length with the model's tokenizer when one is given (else one token
  per word, approximately), each asking for ``output_len`` tokens;
* ``sharegpt``: a ShareGPT JSON file (a list of ``{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", "value": ...}, ...]}``): the first human turn is the
  prompt, the first reply's token count the output length (unless ``output_len`` is
  given); conversations without a reply are skipped.

Arrivals: ``request_rate`` = inf sends everything at once (bounded by the concurrency);
a finite rate draws gaps from a gamma distribution of mean ``1/rate`` and shape
``burstiness`` (1 = Poisson process, as in vLLM). Everything is seeded.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from servehall.bench.client import Endpoint

DATASETS: tuple[str, ...] = ("random", "sharegpt")

_WORD_TEXT = (
    "the cat sees a red apple in the morning and the dog likes the old house near the "
    "lake while a bird finds a green field by the sea the farmer builds a long road "
    "after school my friend reads a new book on the hill the teacher opens the white "
    "door in winter a child carries a heavy box under the bridge the river follows the "
    "tall tree in the forest the wind moves the little boat at the market"
)
_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class PromptTokenizer(Protocol):
    """What a workload needs from a tokenizer (:class:`servehall.text.tokenizer.TextTokenizer`
    fits): plain encode/decode of text."""

    def encode_plain(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a workload.

    Attributes:
        prompt: the user message (chat) or prompt (completions) text.
        prompt_len: its length in tokens (the tokenizer's count; word count without one).
        output_len: ``max_tokens`` to ask for.
    """

    prompt: str
    prompt_len: int
    output_len: int


class WorkloadError(ValueError):
    """A workload cannot be built (bad dataset name or file, bad lengths)."""


def _check_counts(num_requests: int, input_len: int, output_len: int | None) -> None:
    if num_requests < 1:
        raise WorkloadError(f"--num-requests must be at least 1 (got {num_requests})")
    if input_len < 1:
        raise WorkloadError(f"--input-len must be at least 1 (got {input_len})")
    if output_len is not None and output_len < 1:
        raise WorkloadError(f"--output-len must be at least 1 (got {output_len})")


def random_requests(
    num_requests: int,
    input_len: int,
    output_len: int,
    *,
    tokenizer: PromptTokenizer | None = None,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[BenchRequest]:
    """``num_requests`` random prompts (see the module docstring).

    Lengths are drawn uniformly from ``[len·(1 − range_ratio), len·(1 + range_ratio)]``
    (at least 1). Raises WorkloadError on counts below 1 or ``range_ratio`` outside [0, 1).
    """
    _check_counts(num_requests, input_len, output_len)
    if not 0 <= range_ratio < 1:
        raise WorkloadError(f"--range-ratio must be in [0, 1) (got {range_ratio})")
    rng = random.Random(seed)

    def draw(n: int) -> int:
        lo, hi = math.floor(n * (1 - range_ratio)), math.ceil(n * (1 + range_ratio))
        return max(1, rng.randint(lo, hi))

    out = []
    for _ in range(num_requests):
        n_in, n_out = draw(input_len), draw(output_len)
        words = [rng.choice(_WORDS) for _ in range(n_in + 8)]
        text = " ".join(words)
        if tokenizer is None:
            out.append(BenchRequest(" ".join(words[:n_in]), n_in, n_out))
            continue
        ids = tokenizer.encode_plain(text)[:n_in]
        prompt = tokenizer.decode(ids)
        out.append(BenchRequest(prompt, len(tokenizer.encode_plain(prompt)), n_out))
    return out


def _conversation_pairs(data: Any) -> list[tuple[str, str]]:
    if not isinstance(data, list):
        raise WorkloadError("a ShareGPT file holds a JSON list of conversations")
    pairs = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(reply, str) and prompt and reply:
            pairs.append((prompt, reply))
    return pairs


def sharegpt_requests(
    path: Path,
    num_requests: int,
    *,
    tokenizer: PromptTokenizer | None = None,
    output_len: int | None = None,
    max_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """Sample ``num_requests`` conversations from a ShareGPT file (seeded shuffle; the file
    is cycled when it holds fewer). Pairs whose prompt + reply exceed ``max_len`` tokens
    are skipped (vLLM skips those over 2048 as well).

    Raises:
        WorkloadError: the file is missing, not JSON, or holds no usable conversation.
    """
    _check_counts(num_requests, 1, output_len)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise WorkloadError(f"dataset file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read dataset file {path}: {exc}") from None
    pairs = _conversation_pairs(data)
    random.Random(seed).shuffle(pairs)

    def count(text: str) -> int:
        return len(tokenizer.encode_plain(text)) if tokenizer else len(text.split())

    out: list[BenchRequest] = []
    for prompt, reply in pairs:
        p_len, r_len = count(prompt), output_len or count(reply)
        if max_len is not None and p_len + r_len > max_len:
            continue
        out.append(BenchRequest(prompt, p_len, max(1, r_len)))
        if len(out) == num_requests:
            break
    if not out:
        raise WorkloadError(f"dataset file {path} holds no usable ShareGPT conversation")
    while len(out) < num_requests:
        out.append(out[len(out) % len(out)])
    return out[:num_requests]


def build_requests(
    dataset: str,
    num_requests: int,
    *,
    input_len: int = 128,
    output_len: int | None = 128,
    dataset_path: Path | None = None,
    tokenizer: PromptTokenizer | None = None,
    range_ratio: float = 0.0,
    max_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """The requests of ``dataset`` (one of :data:`DATASETS`). For ``random`` an unset
    ``output_len`` means 128. Raises WorkloadError (unknown dataset, missing file...)."""
    if dataset == "random":
        return random_requests(
            num_requests,
            input_len,
            output_len or 128,
            tokenizer=tokenizer,
            range_ratio=range_ratio,
            seed=seed,
        )
    if dataset == "sharegpt":
        if dataset_path is None:
            raise WorkloadError("--dataset sharegpt needs --dataset-path FILE")
        return sharegpt_requests(
            dataset_path,
            num_requests,
            tokenizer=tokenizer,
            output_len=output_len,
            max_len=max_len,
            seed=seed,
        )
    raise WorkloadError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")


def arrival_offsets(
    num_requests: int, request_rate: float, *, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Send time of each request in seconds after the start.

    ``request_rate`` = inf gives all zeros. Otherwise gaps are gamma-distributed with
    shape ``burstiness`` and mean ``1/request_rate`` (shape 1: exponential gaps, i.e. a
    Poisson process). Raises WorkloadError for a rate or burstiness that is not positive.
    """
    if not request_rate > 0:
        raise WorkloadError(f"--request-rate must be positive (got {request_rate})")
    if not burstiness > 0:
        raise WorkloadError(f"--burstiness must be positive (got {burstiness})")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    t, out = 0.0, []
    for _ in range(num_requests):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The workload options of one command, checked."""

    num_requests: int
    concurrency: int | None
    request_rate: float
    burstiness: float
    dataset: str
    dataset_path: Path | None
    input_len: int
    output_len: int | None
    range_ratio: float
    seed: int
    endpoint: Endpoint
    ignore_eos: bool
    slo: dict[str, float]
    response_format: str = "none"

    def requests(self, tokenizer: Any, max_len: int | None = None) -> list[BenchRequest]:
        return build_requests(
            self.dataset,
            self.num_requests,
            input_len=self.input_len,
            output_len=self.output_len,
            dataset_path=self.dataset_path,
            tokenizer=tokenizer,
            range_ratio=self.range_ratio,
            max_len=max_len,
            seed=self.seed,
        )

    def offsets(self) -> list[float] | None:
        if math.isinf(self.request_rate):
            return None
        return arrival_offsets(
            self.num_requests, self.request_rate, burstiness=self.burstiness, seed=self.seed
        )

    def describe(self) -> dict[str, Any]:
        return {
            "num_requests": self.num_requests,
            "concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            "burstiness": self.burstiness,
            "dataset": self.dataset,
            "dataset_path": str(self.dataset_path) if self.dataset_path else None,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "range_ratio": self.range_ratio,
            "seed": self.seed,
            "endpoint": self.endpoint,
            "ignore_eos": self.ignore_eos,
            "slo_ms": self.slo,
            "response_format": self.response_format,
        }


#: ``--response-format json``: a mid-size schema (an order: nested object, bounded array
#: of objects, enums, bounded integers and strings, an optional field), as an API's
#: structured-output request would send it.
BENCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "vip"],
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["sku", "qty"],
            },
        },
        "note": {"type": "string", "maxLength": 40},
    },
    "required": ["order_id", "status", "customer", "items"],
}
RESPONSE_FORMATS = ("none", "json")
"""The values of ``--response-format`` and of a target's ``rf=`` option."""


def response_format_body(kind: str) -> dict[str, Any] | None:
    """The ``response_format`` a bench request sends for ``kind`` (None: free text)."""
    if kind == "none":
        return None
    if kind == "json":
        return {
            "type": "json_schema",
            "json_schema": {"name": "order", "schema": BENCH_SCHEMA, "strict": True},
        }
    raise ValueError(f"unknown response format {kind!r} (none, json)")
