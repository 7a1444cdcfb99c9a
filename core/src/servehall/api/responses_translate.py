"""Responses API ↔ chat completions: a ``/v1/responses`` request becomes the body of a
chat request (which then runs the chat path unchanged: admission, filters, tools,
structured output, records, metrics), and the chat result — whole or streamed — becomes
a ``response`` object or the Responses SSE events.

Request → chat body (:func:`chat_body`): ``instructions`` → a first ``system`` message;
``input`` items → messages (consecutive ``function_call`` items → one ``assistant``
message with ``tool_calls``, ``function_call_output`` → a ``tool`` message); ``tools``
(flat) → chat's ``{type, function: {...}}``; ``tool_choice`` ``{type, name}`` →
``{type, function: {name}}``; ``text.format`` → ``response_format``;
``max_output_tokens`` → ``max_completion_tokens``. Errors the chat path raises name
chat fields; :func:`public_param` names the Responses field instead.

Result → response (:func:`output_items`, :func:`response_object`): the choice's text is
one ``message`` item with one ``output_text`` part, each tool call a ``function_call``
item (``call_id`` the chat call's id, ``id`` a new ``fc_…``). ``finish_reason``
``length`` makes the response ``incomplete`` (``max_output_tokens``), and so does
``content_filter``. The stream (:class:`EventWriter`) is OpenAI's event sequence with
``sequence_number`` from 0.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from servehall.api.responses_wire import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    NamedFunctionChoice,
    ResponsesRequest,
    parts_text,
)
from servehall.tools.calls import ToolCall, ToolCallDelta


def new_id(prefix: str) -> str:
    """A fresh id: ``prefix`` and 32 hex digits (``msg_``, ``fc_``)."""
    return prefix + secrets.token_hex(16)


# --- request → chat ----------------------------------------------------------------------


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as plain items (what a stored response keeps): messages
    ``{type: "message", role, content: str}``, ``function_call`` ``{type, call_id,
    name, arguments}``, ``function_call_output`` ``{type, call_id, output: str}``."""
    if req.input is None:
        return []
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    for item in req.input:
        if isinstance(item, MessageItem):
            out.append({"type": "message", "role": item.role, "content": parts_text(item.content)})
        elif isinstance(item, FunctionCallItem):
            out.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        else:
            assert isinstance(item, FunctionCallOutputItem)
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": parts_text(item.output),
                }
            )
    return out


def output_as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's ``output`` items as plain input items (the next turn's history)."""
    out: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            text = "".join(p.get("text", "") for p in item.get("content", []))
            out.append({"type": "message", "role": "assistant", "content": text})
        elif item.get("type") == "function_call":
            out.append(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
    return out


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of ``instructions`` and plain ``items`` (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": item["content"]})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant" and last.get("content"):
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


def chat_body(req: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body of ``req``, after the plain items of ``history`` (a
    previous response's input and output)."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req.instructions, [*history, *input_items(req)]),
        "stream": req.stream,
    }
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p", "user", "parallel_tool_calls"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.tools is not None:
        body["tools"] = [
            {
                "type": "function",
                "function": t.model_dump(exclude={"type"}, exclude_none=True),
            }
            for t in req.tools
        ]
    if isinstance(req.tool_choice, NamedFunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        spec = fmt.model_dump(exclude={"type"})
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return body


_PARAMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^messages(\[\d+\])?(\..*)?$"), "input"),
    (re.compile(r"^max_completion_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema(?=\.|$)"), "text.format"),
    (re.compile(r"^response_format(?=\.|$)"), "text.format"),
    (re.compile(r"^(tools\[\d+\])\.function(?=\.|$)"), r"\1"),
)


def public_param(param: str | None) -> str | None:
    """A chat field's name as the Responses request spells it (``messages[3]`` →
    ``input``, ``max_completion_tokens`` → ``max_output_tokens``,
    ``response_format.json_schema.schema`` → ``text.format.schema``,
    ``tools[0].function.parameters`` → ``tools[0].parameters``); others unchanged."""
    if param is None:
        return None
    for pattern, repl in _PARAMS:
        if pattern.search(param):
            return pattern.sub(repl, param, count=1)
    return param


def public_message(message: str) -> str:
    """``message`` with the chat field names it quotes spelled as in Responses."""
    return re.sub(
        r"(?:messages(?:\[\d+\])?(?:\.[a-z_]+)?|max_completion_tokens"
        r"|response_format(?:\.[a-z_]+)*|tools\[\d+\]\.function(?:\.[a-z_]+)?)",
        lambda m: public_param(m.group(0)) or m.group(0),
        message,
    )


# --- chat → response ---------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """An assistant ``message`` output item with one ``output_text`` part."""
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """The response's ``status`` and ``incomplete_details`` for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def output_items(
    content: str | None, calls: list[ToolCall], finish_reason: str | None
) -> list[dict[str, Any]]:
    """The ``output`` of a finished choice: its text as a message (unless it only called
    tools), then one ``function_call`` item per call."""
    status = "incomplete" if status_of(finish_reason)[0] == "incomplete" else "completed"
    out: list[dict[str, Any]] = []
    if content or not calls:
        out.append(message_item(new_id("msg_"), content or "", status))
    for c in calls:
        out.append(call_item(new_id("fc_"), c.id, c.name, c.arguments, "completed"))
    return out


def usage_object(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The Responses ``usage`` object."""
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_object(
    rid: str,
    created_at: int,
    req: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    incomplete_details: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object: the result and the request's settings echoed."""
    fmt = req.text.format.model_dump() if req.text and req.text.format else {"type": "text"}
    if isinstance(req.tool_choice, NamedFunctionChoice):
        tool_choice: Any = req.tool_choice.model_dump()
    else:
        tool_choice = req.tool_choice or "auto"
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete_details,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt},
        "tool_choice": tool_choice,
        "tools": [t.model_dump() for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def sse(event: dict[str, Any]) -> bytes:
    """One SSE event as OpenAI sends it: ``event: <type>`` and ``data: <json>``."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class EventWriter:
    """The Responses stream of one choice, as events (dicts with ``type`` and
    ``sequence_number``): :meth:`start`, then :meth:`text` / :meth:`call` per piece, then
    :meth:`finish` (or :meth:`fail`). Items open as their first piece arrives and close
    when another kind of piece, or the end, comes; ``output`` collects them done."""

    def __init__(self, rid: str, req: ResponsesRequest) -> None:
        self.rid = rid
        self.req = req
        self.created_at = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text: list[str] = []
        self._args: list[str] = []
        self.final: dict[str, Any] | None = None  # the response of the last event

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def _response(self, status: str, **kw: Any) -> dict[str, Any]:
        return response_object(
            self.rid,
            self.created_at,
            self.req,
            status=status,
            output=list(self.output),
            usage=kw.pop("usage", None),
            **kw,
        )

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = len(self.output)
        events: list[dict[str, Any]] = []
        if item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(self._event("response.output_text.done", **where, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", **where, part=part))
            done = message_item(item["id"], text, status)
        else:
            args = "".join(self._args)
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=args,
                )
            )
            done = call_item(item["id"], item["call_id"], item["name"], args, "completed")
        events.append(self._event("response.output_item.done", output_index=index, item=done))
        self.output.append(done)
        return events

    def text(self, piece: str) -> list[dict[str, Any]]:
        """Events for a piece of message text."""
        events: list[dict[str, Any]] = []
        if self._open is not None and self._open["type"] != "message":
            events += self._close()
        index = len(self.output)
        if self._open is None:
            self._open = message_item(new_id("msg_"), "", "in_progress")
            self._open["content"] = []
            self._text = []
            events.append(
                self._event("response.output_item.added", output_index=index, item=self._open)
            )
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=self._open["id"],
                    output_index=index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        self._text.append(piece)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._open["id"],
                output_index=index,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return events

    def call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        """Events for a piece of a tool call (its first piece opens the item)."""
        events: list[dict[str, Any]] = []
        if delta.name is not None:
            events += self._close()
            item = call_item(new_id("fc_"), delta.id or "", delta.name, "", "in_progress")
            self._open = item
            self._args = []
            events.append(
                self._event("response.output_item.added", output_index=len(self.output), item=item)
            )
        if delta.arguments and self._open is not None and self._open["type"] == "function_call":
            self._args.append(delta.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._open["id"],
                    output_index=len(self.output),
                    delta=delta.arguments,
                )
            )
        return events

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> list[dict[str, Any]]:
        """Close the open item, then ``response.completed`` (or ``response.incomplete``)."""
        status, details = status_of(finish_reason)
        item_status = "incomplete" if status == "incomplete" else "completed"
        events = self._close(item_status)
        if not self.output:  # nothing generated: an empty message, as non-streamed
            events += self.text("")
            events += self._close(item_status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        final = self.final = self._response(status, usage=usage, incomplete_details=details)
        events.append(self._event(kind, response=final))
        return events

    def fail(self, code: str | None, message: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
        """``response.failed`` with the error (the open item is left out)."""
        self._open = None
        final = self.final = self._response(
            "failed", usage=usage, error={"code": code or "server_error", "message": message}
        )
        return [self._event("response.failed", response=final)]
