"""The soak's traffic: concurrent clients that draw shapes from the mix, send them and
observe the answers (status, request id, usage, stream errors), into a :class:`Traffic`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from servehall.bench.soak.corpus import Shape
from servehall.bench.soak.invariants import FaultWindow, Observation
from servehall.bench.soak.mix import Mix
from servehall.bench.soak.options import SoakOptions
from servehall.errors import status_of_code


def _error_status(envelope: Any) -> int:
    """The HTTP status an SSE error event stands for: a numeric ``status``/``code``, else
    the status of servehall's error with that ``code``, else by ``type`` (500 unless it
    says otherwise)."""
    err = envelope.get("error") if isinstance(envelope, dict) else None
    if not isinstance(err, dict):
        return 500
    for key in ("status", "code"):
        v = err.get(key)
        if isinstance(v, int) and 400 <= v < 600:
            return v
    code = err.get("code")
    status = status_of_code(code) if isinstance(code, str) else None
    if status is not None:  # e.g. engine_unavailable: a 503 whose type is server_error
        return status
    if err.get("type") in ("server_error", "internal_error", "service_unavailable"):
        return 503 if err.get("type") == "service_unavailable" else 500
    return 400


#: The last event of a ``/v1/responses`` stream: its ``response`` holds the usage.
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _usage(obj: Any) -> tuple[int, int] | None:
    """``(prompt, completion)`` tokens of a chat/completions body or usage chunk
    (``usage.prompt_tokens``), of a ``response`` object or of the event that ends a
    Responses stream (``usage.input_tokens``, ``usage.output_tokens``)."""
    if isinstance(obj, dict) and obj.get("type") in RESPONSE_ENDS:
        obj = obj.get("response")
    u = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
        return int(u["prompt_tokens"]), int(u.get("completion_tokens") or 0)
    if isinstance(u, dict) and isinstance(u.get("input_tokens"), int):
        return int(u["input_tokens"]), int(u.get("output_tokens") or 0)
    return None


async def send(client: httpx.AsyncClient, base_url: str, shape: Shape) -> Observation:
    """Send ``shape`` and observe the answer (status, id, usage, stream errors)."""
    t0 = time.monotonic()
    obs = Observation(shape.name, shape.path, t0, t0, 0, disconnected=shape.disconnect)
    headers = {"content-type": shape.content_type}
    try:
        req = client.build_request(
            "POST", base_url + shape.path, content=shape.content(), headers=headers
        )
        resp = await client.send(req, stream=True)
        try:
            obs.status = resp.status_code
            obs.request_id = resp.headers.get("x-request-id")
            sse = resp.headers.get("content-type", "").startswith("text/event-stream")
            obs.stream = sse
            if not sse:
                raw = await resp.aread()
                with contextlib.suppress(ValueError):
                    doc = json.loads(raw)
                    obs.usage = _usage(doc) if resp.status_code == 200 else None
                    if resp.status_code >= 500 and isinstance(doc, dict):
                        err = doc.get("error")
                        if isinstance(err, dict):
                            obs.error = f"{err.get('code')}: {str(err.get('message'))[:100]}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if shape.disconnect:
                        break  # leave after the first event
                    if data == "[DONE]":
                        continue
                    with contextlib.suppress(ValueError):
                        ev = json.loads(data)
                        if isinstance(ev, dict) and "error" in ev:
                            obs.stream_error = _error_status(ev)
                        elif isinstance(ev, dict) and ev.get("type") == "response.failed":
                            obs.stream_error = _error_status(ev.get("response"))
                            obs.usage = _usage(ev)
                        elif (u := _usage(ev)) is not None:
                            obs.usage = u
        finally:
            await resp.aclose()
    except httpx.HTTPError as exc:
        if not (shape.disconnect and obs.status):
            obs.error = f"{type(exc).__name__}: {str(exc)[:120]}"
    obs.ended = time.monotonic()
    return obs


@dataclass
class Traffic:
    """What the clients did."""

    observations: list[Observation] = field(default_factory=list)
    by_category: Counter[str] = field(default_factory=Counter)
    faults: list[FaultWindow] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    duration_s: float = 0.0
    api_restarts: float | None = None
    """``servehall_api_process_restarts_total`` read from ``/metrics`` after the traffic
    (None: not read, e.g. one API process)."""
    api_pids: list[int] = field(default_factory=list)
    """The frontend processes running after the traffic."""


async def run_clients(opts: SoakOptions, base_url: str, mix: Mix, traffic: Traffic) -> None:
    """Run ``opts.clients`` concurrent clients for ``opts.duration_s``, each sending
    shapes drawn from ``mix`` one after another; their observations go to ``traffic``.

    With one API process the clients share one HTTP/2 connection pool (in practice one
    connection). With ``opts.api_processes`` > 1 each client holds a connection of its
    own, so that the kernel spreads them over the frontend processes (one shared HTTP/2
    connection would reach only one of them) and ``api-kill`` cuts some clients'
    streams while the others go on."""
    headers = {"authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.clients, max_keepalive_connections=opts.clients)
    timeout = httpx.Timeout(opts.request_timeout_s, connect=10.0)
    deadline = time.monotonic() + opts.duration_s
    async with httpx.AsyncClient(
        http2=True, http1=False, headers=headers, limits=limits, timeout=timeout
    ) as client:

        async def one_client() -> None:
            if opts.api_processes > 1:
                async with httpx.AsyncClient(
                    http2=True, http1=False, headers=headers, limits=limits, timeout=timeout
                ) as mine:
                    await client_loop(mine)
            else:
                await client_loop(client)

        async def client_loop(client: httpx.AsyncClient) -> None:
            while time.monotonic() < deadline:
                cat, shape = mix.draw()
                traffic.by_category[cat] += 1
                if shape.disconnect:
                    # A client that leaves closes its own connection. On the shared one,
                    # httpcore would leave the stream open (no RST_STREAM on an early
                    # close, encode/httpcore#943): the bytes still in flight are never
                    # credited back, and once the connection's window is used up every
                    # stream on it stalls (the server then ends them after
                    # [server] send_timeout_s, as 499 client_stalled).
                    async with httpx.AsyncClient(
                        http2=True, http1=False, headers=headers, timeout=timeout
                    ) as own:
                        traffic.observations.append(await send(own, base_url, shape))
                    continue
                traffic.observations.append(await send(client, base_url, shape))

        await asyncio.gather(*(one_client() for _ in range(opts.clients)))
