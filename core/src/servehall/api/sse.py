"""The streaming inference response: Server-Sent Events (``chat.completion.chunk`` /
``text_completion`` chunks, an optional usage chunk, an error envelope if generation
fails after the start, then ``data: [DONE]``).

Each chunk is sent as it is made, except the tail: the last choice's final chunk(s),
the usage chunk and ``[DONE]`` are known together and leave in one body message (one
HTTP/2 DATA frame, one write) — a profiled per-request cost (docs/performance.md).
Each chunk's choice object is encoded with msgspec straight to bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Literal

import msgspec
from starlette.types import Send

from servehall.api.response import dumps, response_headers
from servehall.errors import ServehallError
from servehall.serving.choice import ChoiceEvent, ChoiceStream
from servehall.serving.request import RequestState

_encode_choice = msgspec.json.Encoder().encode
"""A chunk's choice object as compact UTF-8 JSON bytes: the same bytes as
:data:`servehall.api.response.dumps` + ``.encode()`` for these plain dicts of strings,
numbers, None and lists, without the intermediate ``str`` (the per-event encode was a
profiled cost, docs/performance.md, issue 38 item 2)."""


def merged_events(choices: list[ChoiceStream]) -> AsyncGenerator[ChoiceEvent, None]:
    """Events of every choice, merged in arrival order: for n = 1 the choice's own
    event generator (no extra generator hop per event, a profiled per-token cost).

    A choice's failure is raised here as itself; closing the generator cancels the
    remaining choices (for n = 1, closing it closes the choice's events).
    """
    if len(choices) == 1:
        return choices[0].events()
    return _merged(choices)


async def _merged(choices: list[ChoiceStream]) -> AsyncGenerator[ChoiceEvent, None]:
    """Events of several choices in arrival order (see :func:`merged_events`)."""
    queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()

    async def pump(c: ChoiceStream) -> None:
        events = c.events()
        try:
            async for ev in events:
                queue.put_nowait(ev)
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            await events.aclose()
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_then_rest(
    first: ChoiceEvent | None, events: AsyncGenerator[ChoiceEvent, None]
) -> AsyncGenerator[ChoiceEvent, None]:
    """``first`` (when not None), then the rest of ``events``."""
    if first is not None:
        yield first
    async for ev in events:
        yield ev


async def send_stream(
    state: RequestState,
    kind: Literal["chat", "completion"],
    req: Any,
    send: Send,
    headers: dict[str, str],
    echo: str,
    *,
    first_before_headers: bool = False,
) -> None:
    """Send status 200 and the SSE stream of ``state``'s choices (see module docstring).

    ``req`` is the validated request (``model``, ``include_usage``); ``echo`` is sent
    first for completions with ``echo``. A :class:`ServehallError` during generation
    becomes an error event and the record's ``error_code``.

    ``first_before_headers``: wait for the first event before the 200 goes out, so that
    an error the engine reports before generating (a constraint it refuses to compile)
    is raised to the caller, which answers it like a non-streamed request (a 400), not
    as an error event after a 200. The constrained requests ask for it; the price is
    that their headers leave with the first token.
    """
    first: ChoiceEvent | None = None
    events = merged_events(state.choices)
    if first_before_headers:
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await events.aclose()
            raise
    chat = kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = (
        f'data: {{"id":"{state.request_id}","object":"{obj}","created":{state.created},'
        f'"model":{dumps(req.model)},"choices":['
    ).encode()
    tail = b"]}\n\n"

    # Events that end the response (the last choice's final chunk, the usage chunk) wait
    # in ``held`` and leave with ``[DONE]`` in one body message: fewer sends per request.
    held: list[bytes] = []

    async def emit(choice: dict[str, Any], *, hold: bool = False) -> None:
        body = head + _encode_choice(choice) + tail
        if hold:
            held.append(body)
            return
        await send({"type": "http.response.body", "body": body, "more_body": True})

    state.response_started = True
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": response_headers(headers, "text/event-stream; charset=utf-8"),
        }
    )
    for c in state.choices:
        if chat:
            await emit(
                {
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
        elif echo:
            await emit({"index": c.index, "text": echo, "logprobs": None, "finish_reason": None})
    unfinished = len(state.choices)
    try:
        try:
            # the extra generator hop only where a first event was taken (constrained)
            stream = events if first is None else first_then_rest(first, events)
            async for ev in stream:
                last = False
                if ev.finish_reason is not None:
                    unfinished -= 1
                    last = unfinished == 0  # nothing but usage and [DONE] follows
                if chat:
                    delta: dict[str, Any] = {"content": ev.text} if ev.text else {}
                    if ev.tool_calls:
                        delta["tool_calls"] = [d.wire() for d in ev.tool_calls]
                    if delta and ev.finish_reason is not None:
                        await emit(
                            {
                                "index": ev.index,
                                "delta": delta,
                                "logprobs": None,
                                "finish_reason": None,
                            },
                            hold=last,
                        )
                        delta = {}
                    await emit(
                        {
                            "index": ev.index,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": ev.finish_reason,
                        },
                        hold=last,
                    )
                else:
                    await emit(
                        {
                            "index": ev.index,
                            "text": ev.text,
                            "logprobs": None,
                            "finish_reason": ev.finish_reason,
                        },
                        hold=last,
                    )
        finally:
            await events.aclose()
    except ServehallError as exc:
        err = dumps(exc.envelope()).encode()
        held.append(b"data: " + err + b"\n\n")
        state.record.error_code = exc.code
    if req.include_usage:
        usage_chunk = {
            "id": state.request_id,
            "object": obj,
            "created": state.created,
            "model": req.model,
            "choices": [],
            "usage": state.usage(),
        }
        held.append(b"data: " + dumps(usage_chunk).encode() + b"\n\n")
    await state.record_before_last_byte()
    held.append(b"data: [DONE]\n\n")
    await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})
