"""The model's tokenizer and chat template, with prompt-injection-safe tokenization.

:func:`load_tokenizer` reads a model directory with ``transformers.AutoTokenizer`` (local
files only; nothing is downloaded). :class:`TextTokenizer` then tokenizes in two modes:

* **template text** (the chat template's own markers such as ``<|im_start|>``) is
  tokenized with special tokens recognised;
* **content** (every message's text and the completion prompt) is tokenized with
  ``encode_special_tokens`` on, so text that merely *looks like* a special token is
  split into ordinary tokens and can never open a fake turn (case C24).

Chat rendering (:meth:`TextTokenizer.render_chat`) renders the template with the real
contents and tokenizes the whole text as ``apply_chat_template(tokenize=True)`` does;
only special-token text inside a content is kept plain (see ``_encode_rendered``).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servehall.errors import InvalidRequestError
from servehall.text.budget import max_token_chars
from servehall.text.detokenize import IncrementalDetokenizer, make_detokenizer_factory

_SKELETONS = 256
"""Conversation structures whose placeholder rendering a tokenizer remembers."""

_MARK = re.compile("\ue000[0-9a-f]{12}[0-9]+\ue001")
"""A message placeholder of :meth:`TextTokenizer.render_chat` (nonce, then index)."""


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message for the template: ``role`` in system/user/assistant/tool, plain
    ``content``; an assistant turn's earlier ``tool_calls`` (OpenAI's
    ``{"id", "type", "function": {"name", "arguments"}}`` dicts, ``arguments`` a dict as
    transformers' templates expect) and a tool turn's ``tool_call_id``."""

    role: str
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None

    def template_message(self, content: str) -> dict[str, Any]:
        """The message dict a chat template receives, with ``content`` in place."""
        msg: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            msg["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


class TextTokenizer:
    """A loaded tokenizer (see the module docstring).

    Attributes:
        hf: the ``transformers`` tokenizer (for its chat template).
        eos_token_ids: ids that end generation, from the tokenizer and generation config.
    """

    def __init__(self, hf: Any, eos_token_ids: Sequence[int] = ()) -> None:
        from tokenizers import Tokenizer

        self.hf = hf
        self._skeletons: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._skeletons_lock = threading.Lock()
        backend = hf.backend_tokenizer
        self._special = backend
        config = json.loads(backend.to_str())
        # a tokenizer.json may pad or truncate every encoding to a fixed length (an
        # embedding model's: all-MiniLM-L6-v2 pads and truncates to 128); user text is
        # neither padded nor silently cut here (length limits are checked, not applied)
        plain = {**_no_special_pieces(config), "padding": None, "truncation": None}
        self._plain = Tokenizer.from_str(json.dumps(plain))
        self._plain.encode_special_tokens = True
        self._plain_inner = Tokenizer.from_str(json.dumps(_never_prepend(plain)))
        self._plain_inner.encode_special_tokens = True
        #: ids of the special added tokens (those ``encode_special_tokens`` turns off)
        self._specials: dict[int, str] = {
            i: t.content for i, t in backend.get_added_tokens_decoder().items() if t.special
        }
        self._special_ids: frozenset[int] = frozenset(self._specials)
        self.new_detokenizer: Callable[[], IncrementalDetokenizer] = make_detokenizer_factory(
            backend
        )
        ids = list(eos_token_ids)
        if hf.eos_token_id is not None and hf.eos_token_id not in ids:
            ids.append(int(hf.eos_token_id))
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        #: most characters one token covers (None: the tokenizer may drop text), for
        #: refusing over-long prompts before tokenizing them (servehall.text.budget)
        self.max_token_chars: int | None = max_token_chars(self._plain)
        #: texts of the special tokens (a template renders tool definitions and earlier
        #: calls as template text, so they must not contain one: see render_chat)
        self.special_texts: tuple[str, ...] = tuple(
            t.content for t in backend.get_added_tokens_decoder().values() if t.special
        )

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode_plain(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Ids of user text; special-token look-alikes become ordinary tokens.

        ``add_special_tokens`` adds what the tokenizer's post-processor adds (e.g. BOS).
        Uses ``encode_batch``, which releases the GIL while it encodes (a multi-MB prompt
        on a worker thread does not stall the event loop).
        """
        enc = self._plain.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return list(enc.ids)

    def encode_template(self, text: str) -> list[int]:
        """Ids of trusted template text, special tokens recognised, nothing added."""
        return list(self._special.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``, without special tokens unless ``skip_special_tokens`` is False
        (then each special token is its text, e.g. ``<s>``). Every id must be one of the
        vocabulary's (:meth:`first_unknown_id`)."""
        return str(self._special.decode(list(ids), skip_special_tokens=skip_special_tokens))

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to ``vocab_size - 1`` (added tokens included); an id in that
        range may still name no token (:meth:`first_unknown_id`)."""
        return int(self._special.get_vocab_size(with_added_tokens=True))

    def first_unknown_id(self, ids: Sequence[int]) -> int | None:
        """The position in ``ids`` of the first id that names no token of this tokenizer
        (negative, ``vocab_size`` or more, or a gap in the vocabulary); None when every
        id is known."""
        size = self.vocab_size
        to_token = self._special.id_to_token
        for k, i in enumerate(ids):
            if not 0 <= i < size or to_token(i) is None:
                return k
        return None

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary spells it (``convert_ids_to_tokens``: a
        byte-level BPE token is written in its byte alphabet, ``Ġ`` for a space; a
        special token is its text). Every id must be known (:meth:`first_unknown_id`)."""
        to_token = self._special.id_to_token
        return [str(to_token(i)) for i in ids]

    def with_special_tokens(self, ids: Sequence[int]) -> list[int]:
        """``ids`` with what the tokenizer's post-processor adds around one sequence
        (BOS, EOS …) added, as ``encode(text, add_special_tokens=True)`` adds them to the
        ids of ``text``; ``ids`` unchanged for a tokenizer that adds nothing."""
        probe = "a"
        bare = self._plain.encode(probe, add_special_tokens=False).ids
        full = self._plain.encode(probe, add_special_tokens=True).ids
        for start in range(len(full) - len(bare) + 1):
            if full[start : start + len(bare)] == bare:
                return [*full[:start], *ids, *full[start + len(bare) :]]
        return list(ids)

    def render_chat(
        self,
        turns: Sequence[ChatTurn],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Prompt ids for a conversation, ending with the assistant generation prompt
        (unless ``add_generation_prompt`` is False).

        The ids are those of ``apply_chat_template(..., tokenize=True)``: the template is
        rendered with the real contents and the whole text is tokenized at once (so a
        SentencePiece tokenizer sees no segment starts inside it, and a template that
        reads the content sees the content). The one difference is on purpose (case
        C24): special-token text that lies inside a message's content is tokenized as
        plain text — see :meth:`_encode_rendered`.

        ``tools`` (OpenAI's ``{"type": "function", "function": {...}}`` dicts) are passed
        to the template as transformers' ``apply_chat_template(tools=...)`` does. Tool
        definitions and earlier tool calls are rendered as template text (the template
        serialises them), so a special token's text inside them is refused.

        Args:
            turns: the messages.
            tools: the request's tools, or None.
            template_kwargs: extra variables for the template, passed to
                ``apply_chat_template`` as keyword arguments.
            add_generation_prompt: end with the template's assistant header.
            continue_final_message: end inside the last message, open for the model to
                continue it (transformers' ``continue_final_message``; the template's
                text after that message's content is cut).

        Raises:
            InvalidRequestError (param ``messages``): the model has no chat template, or
                the template refused the conversation (its own message is included, e.g.
                "Conversation roles must alternate user/assistant/user/assistant/...");
                (param ``tools`` / ``messages``) a special token's text in a tool
                definition or an earlier tool call.
        """
        if not self.has_chat_template:
            raise InvalidRequestError(
                "This model has no chat template; use /v1/completions.", param="messages"
            )
        if tools:
            self._refuse_special(tools, "tools")
        for t in turns:
            if t.tool_calls:
                self._refuse_special(t.tool_calls, "messages")
        extra = dict(template_kwargs or {})
        if tools:
            extra["tools"] = list(tools)
        if not add_generation_prompt:
            extra["add_generation_prompt"] = False
        if continue_final_message:
            extra["continue_final_message"] = True
        rendered = self._apply_template([t.template_message(t.content) for t in turns], extra)
        spans = self._content_spans(turns, rendered, extra)
        if spans is None:
            # the template changed a content on its way into the text (trim, a split at
            # </think>, ...): where it landed is unknown. Fine unless a content carries
            # special-token text; then fall back to encoding contents apart (safe).
            if any(self._has_special(t.content) for t in turns):
                return self._encode_apart(turns, extra)
            spans = []
        return self._encode_rendered(rendered, spans)

    def _apply_template(self, conv: list[dict[str, Any]], extra: dict[str, Any]) -> str:
        try:
            rendered = self.hf.apply_chat_template(
                conv, tokenize=False, **{"add_generation_prompt": True, **extra}
            )
        except Exception as exc:  # jinja2 TemplateError from raise_exception, etc.
            reason = str(exc).strip()[:300] or type(exc).__name__
            raise InvalidRequestError(
                f"The model's chat template rejected these messages: {reason}",
                param="messages",
                code="invalid_messages",
            ) from None
        if not isinstance(rendered, str):
            raise InvalidRequestError("chat template did not render text", param="messages")
        return rendered

    def _placeholder_render(
        self, turns: Sequence[ChatTurn], extra: dict[str, Any]
    ) -> tuple[str, dict[str, str]]:
        """The template rendered with a random placeholder for each content, and the
        placeholder → content map."""
        nonce = secrets.token_hex(6)
        marks = {f"\ue000{nonce}{i}\ue001": t.content for i, t in enumerate(turns)}
        conv = [t.template_message(m) for m, t in zip(marks, turns, strict=True)]
        return self._apply_template(conv, extra), marks

    @staticmethod
    def _structure_key(turns: Sequence[ChatTurn], extra: dict[str, Any]) -> str | None:
        """What the template receives except the contents (roles, tool calls, tool call
        ids, tools, template variables) as a key of remembered placeholder renderings;
        None when a template variable has no JSON spelling (nothing is remembered)."""
        try:
            return json.dumps(
                [[[t.role, t.tool_calls, t.tool_call_id] for t in turns], extra],
                ensure_ascii=False,
                sort_keys=True,
            )
        except (TypeError, ValueError):
            return None

    def _content_spans(
        self, turns: Sequence[ChatTurn], rendered: str, extra: dict[str, Any]
    ) -> list[tuple[int, int]] | None:
        """Where each content lies in ``rendered`` (character ``(start, end)``), found by
        rendering once more with placeholders and checking that putting the contents in
        their place gives ``rendered`` exactly; None when it does not (the template
        transforms or inspects a content).

        The placeholder rendering is remembered per conversation structure
        (:meth:`_structure_key`; up to :data:`_SKELETONS`, the oldest dropped first), so
        a request shaped like an earlier one renders the template once instead of twice.
        A remembered rendering is checked like a fresh one and rendered anew when it no
        longer fits (a template that prints a date), so it changes no result."""
        if not any(t.content for t in turns):
            return []
        key = self._structure_key(turns, extra)
        if key is not None:
            with self._skeletons_lock:
                hit = self._skeletons.get(key)
            if hit is not None:
                skeleton, names = hit
                marks = {m: t.content for m, t in zip(names, turns, strict=True)}
                spans = self._spans_from(skeleton, marks, rendered)
                if spans is not None:
                    return spans
                # stale (a date in the template) or a template that inspects contents
        skeleton, marks = self._placeholder_render(turns, extra)
        if key is not None:
            with self._skeletons_lock:
                self._skeletons.pop(key, None)
                if len(self._skeletons) >= _SKELETONS:  # drop the oldest
                    self._skeletons.pop(next(iter(self._skeletons)))
                self._skeletons[key] = (skeleton, tuple(marks))
        return self._spans_from(skeleton, marks, rendered)

    @staticmethod
    def _spans_from(
        skeleton: str, marks: dict[str, str], rendered: str
    ) -> list[tuple[int, int]] | None:
        """The content spans that ``skeleton`` with ``marks`` replaced puts in
        ``rendered``; None when the result is not ``rendered``."""
        spans: list[tuple[int, int]] = []
        out: list[str] = []
        pos = length = 0
        for match in _MARK.finditer(skeleton):
            content = marks.get(match.group(0))
            if content is None:
                continue
            piece = skeleton[pos : match.start()]
            out.append(piece)
            length += len(piece)
            out.append(content)
            spans.append((length, length + len(content)))
            length += len(content)
            pos = match.end()
        out.append(skeleton[pos:])
        return spans if "".join(out) == rendered else None

    def _has_special(self, text: str) -> bool:
        """True when ``text`` holds special-token text (tokenizing it with special tokens
        recognised finds one)."""
        enc = self._special.encode_batch([text], add_special_tokens=False)[0]
        return bool(self._matches(text, enc))

    def _matches(self, text: str, enc: Any) -> list[tuple[int, tuple[int, int]]]:
        """The special added tokens the tokenizer matched in ``text`` (``enc`` is its
        ``tokenizers.Encoding``): ``(id, offsets)`` of each token that is special *and*
        stands for its own text (not an ``<unk>`` the model produced for an unknown
        character). Only those tokens' offsets are looked up (a multi-MB prompt has
        millions of tokens)."""
        out = []
        for k, i in enumerate(enc.ids):
            content = self._specials.get(i)
            if content is None:
                continue
            start, end = enc.token_to_chars(k)
            if text[start:end].strip() == content.strip():
                out.append((i, (start, end)))
        return out

    def _encode_rendered(self, rendered: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        """Ids of the rendered template text, tokenized whole (``encode_batch``, which
        releases the GIL) exactly as ``apply_chat_template(tokenize=True)`` does.

        When a special token of that encoding lies inside a content span (special-token
        text in a message), the text is instead cut at the template's own special
        tokens and each piece between them is tokenized with special tokens off. The
        tokenizer itself cuts its input at special tokens and encodes the pieces apart
        (``tokenizers``' added-vocabulary split), so for text without look-alikes the
        two ways give the same ids — only the look-alikes become plain tokens.
        """
        enc = self._special.encode_batch([rendered], add_special_tokens=False)[0]
        ids: list[int] = list(enc.ids)
        marks = self._matches(rendered, enc)
        if not any(_overlaps(off, spans) for _, off in marks):
            return ids
        return self.encode_pieces(rendered, [m for m in marks if not _overlaps(m[1], spans)])

    def encode_pieces(
        self, text: str, specials: Sequence[tuple[int, tuple[int, int]]]
    ) -> list[int]:
        """Ids of ``text`` with special tokens only at ``specials`` (``(id, (start, end))``,
        in order): the text between them is tokenized with special tokens off, one piece
        at a time, as the tokenizer's own added-token split does (a piece that does not
        start the text gets no SentencePiece ``▁`` prefix, as in a whole-text encode).
        """
        ids: list[int] = []
        pos = 0
        for tid, (start, end) in specials:
            if start > pos:
                ids.extend(self._encode_piece(text[pos:start], first=pos == 0))
            ids.append(tid)
            pos = end
        if pos < len(text):
            ids.extend(self._encode_piece(text[pos:], first=pos == 0))
        return ids

    def _encode_piece(self, piece: str, *, first: bool) -> list[int]:
        tok = self._plain if first else self._plain_inner
        return list(tok.encode_batch([piece], add_special_tokens=False)[0].ids)

    def _encode_apart(self, turns: Sequence[ChatTurn], extra: dict[str, Any]) -> list[int]:
        """The placeholder way (for templates that transform contents that carry
        special-token text): template pieces and contents tokenized apart."""
        skeleton, marks = self._placeholder_render(turns, extra)
        ids: list[int] = []
        pos = 0
        for match in _MARK.finditer(skeleton):
            content = marks.get(match.group(0))
            if content is None:  # not one of ours (cannot come from the messages)
                continue
            if match.start() > pos:
                ids.extend(self.encode_template(skeleton[pos : match.start()]))
            if content:
                ids.extend(self.encode_plain(content))
            pos = match.end()
        if pos < len(skeleton):
            ids.extend(self.encode_template(skeleton[pos:]))
        return ids

    def _refuse_special(self, value: Any, param: str) -> None:
        text = json.dumps(value, ensure_ascii=False)
        for special in self.special_texts:
            if special in text:
                raise InvalidRequestError(
                    f"Tool definitions and tool calls must not contain the special token "
                    f"{special!r}.",
                    param=param,
                    code="invalid_tools",
                )


def _generation_eos(path: Path) -> list[int]:
    import json

    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.is_file():
            try:
                eos = json.loads(f.read_text()).get("eos_token_id")
            except (OSError, ValueError):
                continue
            if isinstance(eos, int):
                return [eos]
            if isinstance(eos, list):
                return [int(e) for e in eos]
    return []


def load_tokenizer(path: Path | str) -> TextTokenizer:
    """Load the tokenizer of a local model directory (Hugging Face files).

    Raises:
        ValueError: the directory has no usable fast tokenizer.
    """
    from transformers import AutoTokenizer

    p = Path(path).expanduser()
    hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    if not hasattr(hf, "backend_tokenizer"):
        raise ValueError(f"{p}: servehall needs a fast (tokenizers) tokenizer")
    return TextTokenizer(hf, _generation_eos(p))


def _overlaps(off: tuple[int, int], spans: Sequence[tuple[int, int]]) -> bool:
    """True when the character range ``off`` overlaps one of ``spans``."""
    return any(off[0] < e and s < off[1] for s, e in spans)


def _no_special_pieces(config: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer JSON (parsed) whose model cannot spell a special token out of plain
    text: a Unigram entry for a special token gets a score no path picks, a BPE merge
    that would produce one is dropped (the ids stay the same). ``encode_special_tokens``
    only stops the added-token split; a SentencePiece Unigram model that lists ``</s>``
    in its vocabulary would otherwise still produce it from the text ``</s>``."""
    specials = {t["content"] for t in config.get("added_tokens", []) if t.get("special")}
    model = dict(config.get("model") or {})
    if model.get("type") == "Unigram":
        unk = model.get("unk_id")
        model["vocab"] = [
            [p, -1e9] if p in specials and k != unk else [p, score]
            for k, (p, score) in enumerate(model.get("vocab", []))
        ]
    elif model.get("type") == "BPE" and specials:
        model["merges"] = [
            m
            for m in model.get("merges", [])
            if ("".join(m) if isinstance(m, list) else m.replace(" ", "", 1)) not in specials
        ]
    return {**config, "model": model}


def _never_prepend(config: Any) -> Any:
    """A tokenizer JSON (parsed) with every Metaspace ``prepend_scheme: "first"`` made
    ``"never"``: how a piece that does not start the input is pre-tokenized."""
    if isinstance(config, dict):
        out = {k: _never_prepend(v) for k, v in config.items()}
        if out.get("type") == "Metaspace" and out.get("prepend_scheme") == "first":
            out["prepend_scheme"] = "never"
        return out
    if isinstance(config, list):
        return [_never_prepend(v) for v in config]
    return config
