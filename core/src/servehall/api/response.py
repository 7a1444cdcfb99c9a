"""The non-streaming inference response: run every choice to its end, then send one
``chat.completion`` / ``text_completion`` JSON body. Also the compact JSON encoder and
the response headers both response forms use."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Literal

from starlette.types import Send

from servehall.serving.choice import ChoiceStream
from servehall.serving.request import RequestState

log = logging.getLogger("servehall.api")

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""Compact JSON text (UTF-8 characters kept, no spaces) of a JSON-able value."""


def response_headers(
    extra: dict[str, str], ctype: str, length: int | None = None
) -> list[tuple[bytes, bytes]]:
    """ASGI headers: ``content-type``, then ``content-length`` (a body of ``length``
    bytes) or the no-buffering headers of a stream (``length`` None), then ``extra``
    (lower-cased; a header that is not latin-1 is dropped with a warning)."""
    out = [(b"content-type", ctype.encode())]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    else:
        out.append((b"cache-control", b"no-cache"))
        out.append((b"x-accel-buffering", b"no"))
    for k, v in extra.items():
        try:
            out.append((k.lower().encode("latin-1"), v.encode("latin-1")))
        except UnicodeEncodeError:
            log.warning("dropping a response header that is not latin-1: %r", k[:50])
    return out


async def _drain(c: ChoiceStream) -> None:
    events = c.events()
    try:
        async for _ in events:
            pass
    finally:
        await events.aclose()


def _message(c: ChoiceStream) -> dict[str, Any]:
    """The ``message`` of a chat choice: content (null when only tools were called) and,
    when the model called tools, ``tool_calls``."""
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    calls = c.tool_calls
    if calls:
        message["tool_calls"] = [call.wire() for call in calls]
    return message


async def run_choices(state: RequestState) -> None:
    """Generate every choice of ``state`` to its end (the first failure propagates as
    itself)."""
    if len(state.choices) == 1:
        await _drain(state.choices[0])  # no task, no gather: two loop turns fewer
    else:
        tasks = [asyncio.ensure_future(_drain(c)) for c in state.choices]
        try:
            await asyncio.gather(*tasks)  # the first failure propagates as itself
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def send_completion(
    state: RequestState,
    kind: Literal["chat", "completion"],
    model: str,
    send: Send,
    headers: dict[str, str],
    echo: str,
) -> None:
    """Generate every choice of ``state`` to its end (the first failure propagates as
    itself), then send status 200 and the whole JSON body (``echo`` prefixes each
    completion text)."""
    await run_choices(state)
    base = {"id": state.request_id, "created": state.created, "model": model}
    if kind == "chat":
        body: dict[str, Any] = {
            **base,
            "object": "chat.completion",
            "choices": [
                {
                    "index": c.index,
                    "message": _message(c),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in state.choices
            ],
        }
    else:
        body = {
            **base,
            "object": "text_completion",
            "choices": [
                {
                    "index": c.index,
                    "text": echo + c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for c in state.choices
            ],
        }
    body["usage"] = state.usage()
    data = dumps(body).encode("utf-8")
    await state.record_before_last_byte()
    state.response_started = True
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": response_headers(headers, "application/json", len(data)),
        }
    )
    await send({"type": "http.response.body", "body": data, "more_body": False})
