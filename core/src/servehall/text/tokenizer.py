"""The model's tokenizer and chat template, with prompt-injection-safe tokenization.

:func:`load_tokenizer` reads a model directory with ``transformers.AutoTokenizer`` (local
files only; nothing is downloaded). :class:`TextTokenizer` then tokenizes in two modes:

* **template text** (the chat template's own markers such as ``<|im_start|>``) is
  tokenized with special tokens recognised;
* **content** (every message's text and the completion prompt) is tokenized with
  ``encode_special_tokens`` on, so text that merely *looks like* a special token is
  split into ordinary tokens and can never open a fake turn (case C24).

Chat rendering puts a random placeholder in place of each message content, renders the
template once, then tokenizes the template pieces and the content pieces separately and
concatenates the ids.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servehall.errors import InvalidRequestError
from servehall.text.budget import max_token_chars
from servehall.text.detokenize import IncrementalDetokenizer, make_detokenizer_factory

_MARK = re.compile("\ue000[0-9a-f]{12}[0-9]+\ue001")
"""A message placeholder of :meth:`TextTokenizer.render_chat` (nonce, then index)."""

TEMPLATE_CACHE_SIZE = 256
"""Template pieces whose ids :class:`TextTokenizer` keeps (cleared when full)."""


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
        backend = hf.backend_tokenizer
        self._special = backend
        self._plain = Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True
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
        self._template_cache: dict[str, tuple[int, ...]] = {}
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
        """
        return list(self._plain.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_template(self, text: str) -> list[int]:
        """Ids of trusted template text, special tokens recognised, nothing added."""
        return list(self._special.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens."""
        return str(self._special.decode(list(ids), skip_special_tokens=True))

    def render_chat(
        self, turns: Sequence[ChatTurn], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt ids for a conversation, ending with the assistant generation prompt.

        ``tools`` (OpenAI's ``{"type": "function", "function": {...}}`` dicts) are passed
        to the template as transformers' ``apply_chat_template(tools=...)`` does. Tool
        definitions and earlier tool calls are rendered as template text (the template
        serialises them), so a special token's text inside them is refused.

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
        nonce = secrets.token_hex(6)
        marks = {f"\ue000{nonce}{i}\ue001": t.content for i, t in enumerate(turns)}
        conv = [t.template_message(m) for m, t in zip(marks, turns, strict=True)]
        try:
            rendered = self.hf.apply_chat_template(
                conv,
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=True,
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
        ids: list[int] = []
        pos = 0
        for match in _MARK.finditer(rendered):
            content = marks.get(match.group(0))
            if content is None:  # not one of ours (cannot come from the messages)
                continue
            if match.start() > pos:
                ids.extend(self._template_ids(rendered[pos : match.start()]))
            if content:
                ids.extend(self.encode_plain(content))
            pos = match.end()
        if pos < len(rendered):
            ids.extend(self._template_ids(rendered[pos:]))
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

    def _template_ids(self, text: str) -> list[int]:
        """:meth:`encode_template`, cached: a template renders the same few pieces (role
        headers, generation prompt) for every request."""
        ids = self._template_cache.get(text)
        if ids is None:
            if len(self._template_cache) >= TEMPLATE_CACHE_SIZE:
                self._template_cache.clear()  # a template with per-request text (dates)
            ids = self._template_cache[text] = tuple(self.encode_template(text))
        return list(ids)


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
