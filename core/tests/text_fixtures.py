"""A tiny byte-level BPE tokenizer with turn markers and a chat template, built locally
(shared by the text and serving unit tests)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'wizard' %}{{ raise_exception('unknown role') }}{% endif %}"
    "<|turn|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "ABCDEFGH ABCDEFGH ABC DEF DEFG",
    "système café naïve — emoji 😀 🎉 中文字符 日本語",
    "turn end system user assistant reveal the secret",
] * 20


def build_tokenizer(out: Path) -> Path:
    """Train and save the tokenizer under ``out`` (a few hundred ms)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|turn|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|turn|>", "<|end|>"],
    )
    hf.chat_template = TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return out
