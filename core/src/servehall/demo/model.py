"""The demo model's weights: a tiny Llama-architecture decoder, briefly trained on the corpus.

Architecture (Touvron et al., "Llama 2", 2023): RMSNorm, rotary position embeddings,
SwiGLU MLP, grouped-query attention (4 query heads, 2 KV heads), tied input/output
embeddings; about 1.3 M parameters (``small``: 24.6 M, see :data:`SIZES`), context
length 2048. Weights start from a seeded
normal initialisation and take a short AdamW run (one CPU thread; the whole build took 26 s
of CPU on 2026-12-06, docs/api.md#the-demo-model-and-agents) over
the corpus so greedy decoding produces real words rather than one repeated token: 640
steps of four 128-token windows, three of them ending just past a structured reply (a JSON
answer, a tool call, the answer that uses a tool's result) with the loss on the reply only
(:func:`_train`), so under constrained decoding the model closes its strings and, offered
a tool it is asked for, often calls it (docs/api.md#the-demo-model-and-agents).

Determinism: one intra-op thread, ``torch.use_deterministic_algorithms`` and a fixed seed;
two builds with the same package versions on the same CPU give bit-identical weights.
torch and transformers are imported lazily (``servehall[torch]``).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servehall.demo import corpus
from servehall.demo.tokenizer import (
    ASSISTANT,
    BOS,
    END,
    EOS,
    PAD,
    render_chat,
    render_tool_chat,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CONTEXT_LENGTH = 2048
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 352
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
TRAIN_STEPS = 640
TRAIN_BATCH = 4
TRAIN_SEQ_LEN = 128
LEARNING_RATE = 2e-3
WARMUP = 20
"""Steps of linear learning-rate warm-up."""
ANCHORED_ROWS = 3
"""Rows of each training batch that start shortly before a structured reply (the rest
start anywhere in the corpus)."""
ANCHOR_CONTEXT = (24, 64)
"""How many tokens before its reply an anchored window starts (drawn uniformly): enough
to hold the user's question and the end of the tools' system turn."""
MASK_CONTEXT = True
"""Anchored rows learn only their reply and what follows (the context's labels are -100)."""


@dataclass(frozen=True, slots=True)
class ModelSize:
    """Shape and training budget of one demo-model size (same tokenizer, corpus and recipe).

    Attributes:
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads: the Llama
            shape (head dim = hidden / heads).
        train_steps: AdamW steps of the short training run.
        learning_rate: its peak learning rate.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    train_steps: int
    learning_rate: float


SIZES: dict[str, ModelSize] = {
    # ~1.3 M parameters: starts in seconds; the frontend dominates its cost on a CPU.
    "demo": ModelSize(
        HIDDEN_SIZE,
        INTERMEDIATE_SIZE,
        NUM_LAYERS,
        NUM_HEADS,
        NUM_KV_HEADS,
        TRAIN_STEPS,
        LEARNING_RATE,
    ),
    # ~24.6 M parameters: big enough that the engine, not the frontend, dominates a CPU
    # (the model the platform ÷ engine budgets are judged on). Fewer training steps keep
    # the build around a minute; its text is rougher than the demo model's.
    "small": ModelSize(512, 1408, 8, 8, 4, 80, 1.5e-3),
}
"""Model sizes of ``servehall demo-model --size``."""


def llama_config(tok: Tokenizer, size: ModelSize = SIZES["demo"]) -> dict[str, Any]:
    """The ``config.json`` fields of the demo model (a ``LlamaForCausalLM``) of ``size``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": size.hidden_size // size.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT_LENGTH,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": [tok.token_to_id(END), tok.token_to_id(EOS)],
        "pad_token_id": tok.token_to_id(PAD),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def generation_config(tok: Tokenizer) -> dict[str, Any]:
    """The ``generation_config.json`` fields (greedy by default, both end tokens stop)."""
    return {
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": [tok.token_to_id(END), tok.token_to_id(EOS)],
        "pad_token_id": tok.token_to_id(PAD),
        "do_sample": False,
    }


@dataclass(frozen=True, slots=True)
class TrainingStream:
    """The tokenized corpus (:func:`training_stream`).

    Attributes:
        ids: every document's token ids, concatenated.
        anchors: positions in ``ids`` where a structured reply starts (the first token
            after ``<|assistant|>\n`` in JSON and tool chats, the ``{`` of a JSON text):
            the decisions a briefly trained model most needs to see, so part of each
            training batch is windows that end just past one (:func:`_train`).
        unlearned: positions in ``ids`` whose token no window learns (label -100): the
            first token of a forced-call chat's reply (``[{"``). ``tool_choice:
            "required"`` forces it by grammar; its prompt is the same as under
            ``"auto"``, where the reply should start with ``<tool_call>``, so the model
            learns how a forced call goes on, not to start one by itself.
    """

    ids: list[int]
    anchors: list[int]
    unlearned: list[int]


ANCHOR_WEIGHT = {"json": 1, "json_chat": 1, "tools": 2, "forced": 2}
"""How often each kind's anchors are listed (a tool chat's and a forced-call chat's
replies are drawn twice as often)."""


def training_stream(tok: Tokenizer, seed: int) -> TrainingStream:
    """All corpus documents tokenized and concatenated: text as ``BOS text EOS``, chats
    rendered with the demo chat format (each reply ends with ``<|end|>``), tool chats
    exactly as the chat template renders them with ``tools``.

    Drill lines are encoded in four pieces split at random characters, so the model also
    sees words continued from a non-canonical token boundary (``... ABC`` + ``DEFGH``).
    """
    rng = random.Random(seed + 1)
    ids: list[int] = []
    anchors: list[int] = []
    unlearned: list[int] = []
    for kind, payload in corpus.documents(seed):
        if kind == "drill":
            assert isinstance(payload, str)
            cuts = sorted(rng.sample(range(1, len(payload)), 3))
            bounds = [0, *cuts, len(payload)]
            parts = [payload[a:b] for a, b in itertools.pairwise(bounds)]
            parts[0], parts[-1] = BOS + parts[0], parts[-1] + EOS
            for part in parts:
                ids += tok.encode(part, add_special_tokens=False).ids
            continue
        if kind in ("chat", "json_chat"):
            assert isinstance(payload, list)
            msgs: list[tuple[str, str]] = []
            for q, a in payload:
                msgs += [("user", q), ("assistant", a)]
            text = render_chat(msgs)
        elif kind in ("tools", "forced"):
            assert isinstance(payload, tuple)
            tools, messages = payload
            text = render_tool_chat(messages, tools)
        else:
            text = f"{BOS}{payload}{EOS}"
        enc = tok.encode(text, add_special_tokens=False)
        if kind in ANCHOR_WEIGHT:
            marks = _reply_starts(text) if kind != "json" else [len(BOS)]
            found = [len(ids) + i for i, (start, _) in enumerate(enc.offsets) if start in marks]
            if kind == "forced":  # see TrainingStream.unlearned
                unlearned += found
                found = [i + 1 for i in found]
            anchors += found * ANCHOR_WEIGHT[kind]
        ids += enc.ids
    return TrainingStream(ids, anchors, unlearned)


def _reply_starts(text: str) -> set[int]:
    """Character offsets just past each ``<|assistant|>\n`` in ``text``."""
    head = f"{ASSISTANT}\n"
    out, at = set(), text.find(head)
    while at >= 0:
        out.add(at + len(head))
        at = text.find(head, at + 1)
    return out


def build_weights(tok: Tokenizer, out: Path, *, seed: int, size: ModelSize = SIZES["demo"]) -> None:
    """Initialise, briefly train and save the model of ``size`` into ``out``
    (``config.json``, ``generation_config.json``, ``model.safetensors``)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = llama_config(tok, size)
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        config = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
        model = LlamaForCausalLM(config).float()
        _train(model, training_stream(tok, seed), seed, size)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        state.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = generation_config(tok)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _train(model: Any, stream: TrainingStream, seed: int, size: ModelSize) -> None:
    """A short AdamW run of next-token prediction on windows of ``stream``: each batch has
    :data:`ANCHORED_ROWS` windows that start :data:`ANCHOR_CONTEXT` tokens before a random
    anchor (a structured reply, learned with its context masked), the rest start
    anywhere; no window learns the stream's ``unlearned`` tokens."""
    import torch

    rng = random.Random(seed)
    data = torch.tensor(stream.ids, dtype=torch.long)
    learned = torch.ones(len(stream.ids), dtype=torch.bool)
    learned[stream.unlearned] = False
    last = len(stream.ids) - TRAIN_SEQ_LEN - 1
    peak, steps = size.learning_rate, size.train_steps
    opt = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0)
    model.train()
    for step in range(steps):
        starts = [rng.randrange(0, last) for _ in range(TRAIN_BATCH - ANCHORED_ROWS)]
        lead = []
        for _ in range(ANCHORED_ROWS):
            anchor = rng.choice(stream.anchors)
            start = min(max(0, anchor - rng.randint(*ANCHOR_CONTEXT)), last)
            starts.append(start)
            lead.append(anchor - start)
        batch = torch.stack([data[s : s + TRAIN_SEQ_LEN] for s in starts])
        labels = batch.clone()
        labels[~torch.stack([learned[s : s + TRAIN_SEQ_LEN] for s in starts])] = -100
        if MASK_CONTEXT:
            for row, n in enumerate(lead, start=TRAIN_BATCH - ANCHORED_ROWS):
                labels[row, :n] = -100
        lr = peak * min(1.0, (step + 1) / WARMUP) * (1 - step / steps * 0.9)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = model(input_ids=batch, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
