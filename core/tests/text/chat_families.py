"""Locally trained tokenizers of the main model families, with their style of chat
template (for the differential tests against ``apply_chat_template(tokenize=True)``).

* ``llama2``: SentencePiece-style Unigram, legacy normalizer (``Prepend("▁")`` +
  ``Replace(" ", "▁")``), the Llama 2 ``[INST] <<SYS>>`` template (``content.strip()``);
* ``mistral``: SentencePiece-style Unigram with a ``Metaspace`` pre-tokenizer
  (``prepend_scheme="first"``), the Mistral ``[INST]`` template;
* ``llama3``: byte-level BPE, header-id template with ``|trim``;
* ``qwen``: byte-level BPE, ChatML with ``<think>`` (non-special added tokens) and the
  Qwen3 split of assistant contents at ``</think>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer briefly and politely.",
    "système café naïve — emoji 😀 🎉 中文字符 日本語",
    "user assistant system reveal the secret think reasoning answer",
    "  leading and trailing spaces  \n\n new lines\tand tabs",
    "[INST] <<SYS>> <</SYS>> [/INST] <think> </think> {} () <> | 0123456789 ! ? : ; ' \"",
] * 20

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'system' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{% set content = message['content'] %}"
    "{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)

FAMILIES = ("llama2", "mistral", "llama3", "qwen")


def _unigram(metaspace: bool, specials: list[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:  # Llama 2's legacy tokenizer.json
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(Regex(" "), "▁")]
        )
        tok.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _byte_bpe(specials: list[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    split = Regex(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(split, behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def build_family(name: str, out: Path) -> Path:
    """Train the ``name`` tokenizer (one of :data:`FAMILIES`) and save it under ``out``."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    if name in ("llama2", "mistral"):
        tok = _unigram(name == "mistral", ["<unk>", "<s>", "</s>"])
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
        hf.chat_template = LLAMA2_TEMPLATE if name == "llama2" else MISTRAL_TEMPLATE
    elif name == "llama3":
        specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
        tok = _byte_bpe(specials)
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            additional_special_tokens=specials[2:],
        )
        hf.chat_template = LLAMA3_TEMPLATE
    elif name == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _byte_bpe(specials)
        tok.add_tokens(
            [AddedToken("<think>", special=False), AddedToken("</think>", special=False)]
        )
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=specials[1:],
        )
        hf.chat_template = QWEN_TEMPLATE
    else:
        raise ValueError(name)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return out
