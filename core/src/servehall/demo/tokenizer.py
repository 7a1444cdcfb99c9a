"""The demo model's byte-level BPE tokenizer and chat template.

The tokenizer is trained with the Hugging Face ``tokenizers`` library (byte-level BPE as in
GPT-2, Radford et al. 2019) on :func:`servehall.demo.corpus.tokenizer_corpus`, so identical
package versions give an identical ``tokenizer.json``. Like Llama 3, encoding with special
tokens prepends ``<|begin_of_text|>``; chat templates already contain it, so templated
prompts are tokenized with ``add_special_tokens=False``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END)
"""Special tokens, in id order (ids 0..6)."""

TAG_TOKENS = ("<tool_call>", "</tool_call>")
"""Plain-text (not special) added tokens, one each, as Qwen 2.5 has them: the tool-call tags
the model writes (ids after the trained vocabulary)."""

VOCAB_SIZE = 2048
"""Target vocabulary size, special tokens and the 256 byte symbols included."""

DEMO_CHAT_TEMPLATE = (
    "{%- if messages | length == 0 %}{{ raise_exception('messages must not be empty') }}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|system|>\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] ~ '\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' ~ (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception(\"unknown role '\" ~ message['role'] ~ \"'; "
    'expected system, user, assistant or tool") }}'
    "{%- endif %}"
    "{%- if message['role'] == 'system' and not loop.first %}"
    "{{- raise_exception('a system message may only come first') }}"
    "{%- endif %}"
    "{%- if message['content'] is not string %}"
    "{{- raise_exception('message content must be a string') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|user|>\\n<tool_response>\\n' ~ message['content'] ~ '\\n</tool_response><|end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined"
    " and message['tool_calls'] %}"
    "{{- '<|assistant|>\\n' ~ message['content'] }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] %}"
    "{{- '<tool_call>\\n{\"name\": ' ~ (f['name'] | tojson) ~ ', \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}"
    "{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|end|>\\n' }}"
    "{%- else %}"
    "{{- '<|' ~ message['role'] ~ '|>\\n' ~ message['content'] ~ '<|end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)
"""Strict Jinja chat template: roles ``system`` (first only), ``user``, ``assistant``,
``tool``; string content only; anything else raises (``raise_exception``). Each turn
renders as ``<|role|>\\n{content}<|end|>\\n``; the generation prompt is
``<|assistant|>\\n``. With ``tools`` (transformers' ``apply_chat_template(tools=...)``) a
system turn lists them in Hermes format (``<tools>`` JSON lines, calls asked as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``; a first system message's
content leads it); an assistant turn's ``tool_calls`` render as such calls after its
content, and a ``tool`` message as a user turn holding ``<tool_response>…</tool_response>``
(Qwen 2.5's layout)."""


def render_chat(messages: list[tuple[str, str]], add_generation_prompt: bool = False) -> str:
    """Render ``[(role, content)]`` exactly as :data:`DEMO_CHAT_TEMPLATE` does (no Jinja)."""
    out = BOS
    for role, content in messages:
        out += f"<|{role}|>\n{content}{END}\n"
    if add_generation_prompt:
        out += f"{ASSISTANT}\n"
    return out


TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def render_tool_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render OpenAI-shaped ``messages`` (and ``tools``) exactly as
    :data:`DEMO_CHAT_TEMPLATE` does, without Jinja (for the training corpus; a test holds
    the two equal). Each message has ``role`` and string ``content``; an assistant's
    ``tool_calls`` are ``[{"function": {"name": str, "arguments": str | dict}}]``."""
    out = BOS
    if tools:
        out += f"{SYSTEM}\n"
        if messages and messages[0]["role"] == "system":
            out += messages[0]["content"] + "\n\n"
        out += TOOLS_HEADER
        out += "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        out += TOOLS_FOOTER + f"{END}\n"
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system" and tools:
            continue
        if role == "tool":
            out += f"{USER}\n<tool_response>\n{content}\n</tool_response>{END}\n"
        elif role == "assistant" and m.get("tool_calls"):
            out += f"{ASSISTANT}\n{content}"
            for call in m["tool_calls"]:
                f = call["function"]
                args = f["arguments"]
                args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                name = json.dumps(f["name"], ensure_ascii=False)
                out += f'<tool_call>\n{{"name": {name}, "arguments": {args}}}\n</tool_call>'
            out += f"{END}\n"
        else:
            out += f"<|{role}|>\n{content}{END}\n"
    if add_generation_prompt:
        out += f"{ASSISTANT}\n"
    return out


def train_tokenizer(lines: list[str]) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``lines``; returns a ``tokenizers.Tokenizer``.

    Special tokens get ids 0..6 (:data:`SPECIAL_TOKENS`); a post-processor prepends BOS.
    """
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    if TAG_TOKENS:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAG_TOKENS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def write_tokenizer_files(
    tok: Tokenizer, out: Path, *, chat_template: str, model_max_length: int
) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``."""
    tok.save(str(out / "tokenizer.json"), pretty=True)
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "model_input_names": ["input_ids", "attention_mask"],
        "added_tokens_decoder": added,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": END, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
