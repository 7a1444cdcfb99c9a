"""Incremental detokenization that never emits a split UTF-8 character.

Two strategies, chosen once per tokenizer by :func:`make_detokenizer_factory`:

* **byte table** (byte-level BPE, GPT-2/Llama-3 style): every token id maps to its raw
  bytes; bytes go through Python's incremental UTF-8 decoder, which keeps an incomplete
  multi-byte sequence until its continuation bytes arrive. About 1 µs per token. Special
  tokens map to no bytes (``skip_special_tokens``).
* **offset window** (any other tokenizer): the prefix/read-offset method of Hugging Face
  TGI and vLLM — decode a short window of recent ids twice and emit the new suffix only
  when it does not end in U+FFFD (an incomplete character).

:meth:`IncrementalDetokenizer.finish` releases what is still held, with U+FFFD for bytes
that never became a valid character.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from typing import Any


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte ↔ printable-unicode map (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _is_byte_level(spec: dict[str, Any]) -> bool:
    dec = spec.get("decoder") or {}
    if dec.get("type") == "ByteLevel":
        return True
    if dec.get("type") == "Sequence":
        return [d.get("type") for d in dec.get("decoders", [])] == ["ByteLevel"]
    return False


def byte_table(backend: Any) -> list[bytes] | None:
    """``id → bytes`` for a byte-level ``tokenizers.Tokenizer``, else None."""
    spec = json.loads(backend.to_str())
    if not _is_byte_level(spec):
        return None
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    size = max(vocab.values(), default=-1) + 1
    table: list[bytes] = [b""] * size
    for tok, i in vocab.items():
        a = added.get(i)
        if a is not None:
            table[i] = b"" if a.get("special") else a["content"].encode("utf-8")
            continue
        try:
            table[i] = bytes(_UNICODE_TO_BYTE[c] for c in tok)
        except KeyError:
            return None  # not a pure byte-level vocabulary
    return table


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas (one instance per choice)."""

    __slots__ = ("_backend", "_decoder", "_ids", "_prefix", "_read", "_table")

    def __init__(self, table: list[bytes] | None, backend: Any = None) -> None:
        self._table = table
        self._backend = backend
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the text that is now complete (possibly empty)."""
        table = self._table
        if table is not None:
            n = len(table)
            data = b"".join(table[i] if 0 <= i < n else b"" for i in token_ids)
            return self._decoder.decode(data) if data else ""
        self._ids.extend(token_ids)
        decode = self._backend.decode
        prefix_text = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        new_text = decode(self._ids[self._prefix :], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def finish(self) -> str:
        """The stream ended: release held text (U+FFFD for incomplete characters)."""
        if self._table is not None:
            return self._decoder.decode(b"", final=True)
        decode = self._backend.decode
        prefix_text = decode(self._ids[self._prefix : self._read], skip_special_tokens=True)
        new_text = decode(self._ids[self._prefix :], skip_special_tokens=True)
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


def make_detokenizer_factory(backend: Any) -> Callable[[], IncrementalDetokenizer]:
    """A factory of detokenizers for one ``tokenizers.Tokenizer`` (table built once)."""
    table = byte_table(backend)

    def factory() -> IncrementalDetokenizer:
        return IncrementalDetokenizer(table, backend)

    return factory
