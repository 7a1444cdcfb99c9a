"""Prompt preparation for the inference endpoints: the text parts input filters see,
and the chat turns the tokenizer's chat template renders."""

from __future__ import annotations

from servehall.api.tools import template_arguments
from servehall.api.wire import ChatPromptRequest, CompletionRequest, ToolMessage
from servehall.text.tokenizer import ChatTurn


def prompt_texts(req: ChatPromptRequest | CompletionRequest) -> tuple[list[str], list[int]]:
    """Every text part of the prompt and the index of the message it belongs to.

    A completion request has one part (owner 0); a chat request (``/v1/chat/completions``
    or ``/tokenize`` with messages) one per string content or per content part of each
    message, in order.
    """
    if isinstance(req, CompletionRequest):
        return [req.prompt_text()], [0]
    texts: list[str] = []
    owners: list[int] = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            for p in m.content:
                texts.append(p.text)
                owners.append(i)
        else:
            texts.append(m.content or "")
            owners.append(i)
    return texts, owners


def chat_turns(req: ChatPromptRequest, texts: list[str], owners: list[int]) -> list[ChatTurn]:
    """One :class:`ChatTurn` per message, its (possibly filtered) parts joined by newlines.

    ``texts``/``owners`` are :func:`prompt_texts`' output after input filters; the
    ``developer`` role is rendered as ``system``; an assistant turn keeps its
    ``tool_calls`` (arguments as objects where they are JSON objects), a tool turn its
    ``tool_call_id``.
    """
    joined: dict[int, list[str]] = {}
    for t, i in zip(texts, owners, strict=True):
        joined.setdefault(i, []).append(t)
    turns = []
    for i, m in enumerate(req.messages):
        content = "\n".join(joined.get(i, []))
        if m.role == "assistant" and m.tool_calls:
            calls = tuple(
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": template_arguments(c.function.arguments),
                    },
                }
                for c in m.tool_calls
            )
            turns.append(ChatTurn("assistant", content, tool_calls=calls))
        elif isinstance(m, ToolMessage):
            turns.append(ChatTurn("tool", content, tool_call_id=m.tool_call_id))
        else:
            turns.append(ChatTurn("system" if m.role == "developer" else m.role, content))
    return turns
