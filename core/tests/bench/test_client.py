"""``bench``'s client counts a stream cut before ``data: [DONE]`` as a failure (issue 26),
against a real socket server that streams SSE over HTTP/1.1 and then closes."""

from __future__ import annotations

import asyncio
import json

import httpx

from servehall.bench.client import ClientOptions, send_request
from servehall.bench.workload import BenchRequest


def _chunk(text: str) -> bytes:
    data = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
    return f"data: {data}\n\n".encode()


def _full(finish: bool) -> bytes:
    return _chunk("Hello") + _chunk(" world") + (b"data: [DONE]\n\n" if finish else b"")


def _event(data: dict[str, object]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _serve(body: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # a clean end of the HTTP body either way: only the missing [DONE] shows the cut
        writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _one(body: bytes) -> tuple[bool, str, int]:
    server, port = await _serve(body)
    opts = ClientOptions(base_url=f"http://127.0.0.1:{port}", model="m", http2=False)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            out = await send_request(client, opts, BenchRequest("hi", 1, 2), 0.0)
    finally:
        server.close()
        await server.wait_closed()
    return out.success, out.error, len(out.token_times)


async def test_complete_stream_succeeds() -> None:
    ok, err, tokens = await _one(_full(True))
    assert ok and not err and tokens == 2


async def test_stream_cut_before_done_fails() -> None:
    ok, err, tokens = await _one(_full(False))
    assert not ok and tokens == 2
    assert "before [DONE]" in err, err


def _textless(completion_tokens: int) -> bytes:
    """A chat stream whose one token decodes to no text: the role chunk, the finish
    chunk (empty content), the usage chunk, ``[DONE]``."""
    return (
        _chunk("")
        + _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        + _event(
            {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens}}
        )
        + b"data: [DONE]\n\n"
    )


async def test_a_token_without_text_is_timed_at_the_finish_chunk() -> None:
    """A one-token request whose token is, say, the first byte of a character streams no
    text; the usage says a token was generated, so the request succeeded (timed at its
    finish chunk) instead of counting as failed."""
    ok, err, tokens = await _one(_textless(1))
    assert ok and not err and tokens == 1


async def test_a_stream_without_any_token_still_fails() -> None:
    ok, err, tokens = await _one(_textless(0))
    assert not ok and tokens == 0 and err == "the stream carried no token"
