"""An OpenAI-compatible streaming client that times every token (httpx, HTTP/2 or 1.1).

Works against any server that speaks ``/v1/chat/completions`` or ``/v1/completions``
with ``stream: true`` (servehall, ``vllm serve``, ``transformers serve``, TGI's
Messages API, LiteLLM...). Each request asks for ``stream_options.include_usage`` so the
server's own token counts are used when it reports them; otherwise one content chunk
counts as one token (vLLM's fallback). ``ignore_eos`` (a vLLM extension that servehall
also accepts) asks for exactly ``max_tokens`` tokens; servers that do not know it ignore
unknown fields.

HTTP/2 is cleartext prior knowledge (h2c) on ``http://`` URLs and ALPN on ``https://``;
``http2=False`` forces HTTP/1.1 with one connection per concurrent request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from servehall.bench.metrics import RequestOutput
from servehall.bench.workload import BenchRequest

Endpoint = Literal["chat", "completions"]
PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class TargetError(Exception):
    """The target cannot be benchmarked (unreachable, refuses the key, unknown model);
    the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How requests are sent.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is fine).
        model: the ``model`` field of every request.
        api_key: sent as ``Authorization: Bearer``; None sends no header.
        endpoint: ``chat`` or ``completions``.
        http2: HTTP/2 (h2c prior knowledge on http://) instead of HTTP/1.1.
        ignore_eos: send ``ignore_eos: true`` (fixed output lengths).
        temperature: sampling temperature (0 = greedy, vLLM's benchmark default).
        timeout_s: per-request read timeout in seconds.
        response_format: sent as ``response_format`` (structured output); a constrained
            request never sends ``ignore_eos`` (its grammar ends it).
    """

    base_url: str
    model: str
    api_key: str | None = None
    endpoint: Endpoint = "chat"
    http2: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout_s: float = 600.0
    response_format: dict[str, Any] | None = None

    @property
    def root(self) -> str:
        url = self.base_url.rstrip("/")
        return url.removesuffix("/v1")

    @property
    def url(self) -> str:
        return self.root + PATHS[self.endpoint]


def make_client(opts: ClientOptions, max_connections: int) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for ``opts`` (HTTP/2 only when ``opts.http2``)."""
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(
        max_connections=max(1, max_connections), max_keepalive_connections=max(1, max_connections)
    )
    return httpx.AsyncClient(
        http1=not opts.http2,
        http2=opts.http2,
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(opts.timeout_s, connect=10.0),
    )


def request_body(
    opts: ClientOptions, req: BenchRequest, max_tokens: int | None = None
) -> dict[str, Any]:
    """The JSON body of one streamed request."""
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": max_tokens or req.output_len,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.response_format is not None:
        body["response_format"] = opts.response_format
    elif opts.ignore_eos:
        body["ignore_eos"] = True
    if opts.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def error_message(status: int, raw: bytes) -> str:
    """``"HTTP 401: <message>"`` from an OpenAI error envelope (or the raw body)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
        elif isinstance(err, str):
            text = err
        elif isinstance(data, dict) and isinstance(data.get("detail"), str):
            text = data["detail"]
    except ValueError:
        pass
    first = text.splitlines()[0] if text else httpx.codes.get_reason_phrase(status)
    return f"HTTP {status}: {first[:200]}"


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any]:
    choices = chunk.get("choices") or []
    return choices[0] if choices else {}


def _chunk_text(chunk: dict[str, Any], endpoint: Endpoint) -> str:
    choice = _first_choice(chunk)
    if endpoint == "chat":
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


async def send_request(
    client: httpx.AsyncClient,
    opts: ClientOptions,
    req: BenchRequest,
    t0: float,
    *,
    max_tokens: int | None = None,
) -> RequestOutput:
    """Stream one request and time it (see :class:`~servehall.bench.metrics.RequestOutput`).

    Transport errors and non-2xx statuses give a failed output with a one-line
    ``error``; an error event inside the stream does too, and so does a stream that
    ends before its ``data: [DONE]`` line (cut by the server or a proxy: tokens may be
    missing).

    A complete stream whose tokens carried no text (one token that decodes to nothing
    yet, such as a byte of a multi-byte character) succeeds when the server's usage
    counts generated tokens: its first token is timed at the chunk that carried the
    ``finish_reason``. (vLLM's benchmark counts such a request as failed — "never
    received a valid chunk" — which drops a finished request from every figure.)"""
    out = RequestOutput(prompt_tokens=req.prompt_len)
    start = time.perf_counter()
    out.start = start - t0
    last = start
    chunks = 0
    usage: dict[str, Any] | None = None
    finished: float | None = None  # when a chunk carried the finish_reason
    done = False
    try:
        async with client.stream("POST", opts.url, json=request_body(opts, req, max_tokens)) as r:
            out.status = r.status_code
            if r.status_code >= 300:
                out.error = error_message(r.status_code, await r.aread())
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    out.error = f"stream error: {msg}"
                    return out
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if finished is None and _first_choice(chunk).get("finish_reason"):
                    finished = now
                if not _chunk_text(chunk, opts.endpoint):
                    continue
                if chunks == 0:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                out.token_times.append(now - t0)
                last = now
                chunks += 1
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return out
    except ValueError as exc:
        out.error = f"bad stream data: {exc}"
        return out
    out.output_tokens = chunks
    if usage:
        out.output_tokens = int(usage.get("completion_tokens") or chunks)
        out.prompt_tokens = int(usage.get("prompt_tokens") or req.prompt_len)
    if chunks == 0 and done and finished is not None and out.output_tokens > 0:
        out.ttft = finished - start  # the tokens decoded to no text: timed at the finish
        out.token_times.append(finished - t0)
        last, chunks = finished, 1
    out.latency = last - start
    out.success = chunks > 0 and done
    if not done:
        out.error = f"the stream ended before [DONE] after {chunks} token chunk(s)"
    elif not out.success:
        out.error = "the stream carried no token"
    return out


async def preflight(client: httpx.AsyncClient, opts: ClientOptions, req: BenchRequest) -> None:
    """Send one short request first, so a target that cannot work fails with one line
    (vLLM's "initial test run"). Raises TargetError."""
    try:
        out = await send_request(client, opts, req, time.perf_counter(), max_tokens=2)
    except Exception as exc:  # pragma: no cover - send_request catches transport errors
        raise TargetError(f"{opts.url}: {exc}") from None
    if out.success:
        return
    if out.status is None and out.error.startswith(("ConnectError", "ConnectTimeout")):
        detail = out.error.split(":", 1)[1].strip() if ":" in out.error else out.error
        raise TargetError(f"cannot reach {opts.root}: {detail or 'connection failed'}")
    raise TargetError(f"{opts.url}: {out.error}")
