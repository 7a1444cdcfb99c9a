"""A tiny ASGI app on a real Hypercorn, run as a subprocess by ``test_connections.py``.

``python conn_server.py PORT [--fixes] [--keep-alive S] [--max-streams N]`` serves
127.0.0.1:PORT and prints ``ready`` once its socket listens. With ``--fixes`` it installs
:func:`servehall.server.hypercorn.install_connection_fixes` (what ``servehall serve``
does); without, it is a bare Hypercorn 0.18 (the control that shows each bug).

Routes (any method):

* ``/ok`` — 200 ``ok`` without reading the body;
* ``/early`` — 415 without reading the body, then drains it like servehall's endpoints
  (:func:`servehall.api.body.drain_body`);
* ``/early-close`` — 413 with ``Connection: close`` without reading the body (``?slow``:
  after 0.5 s, as if authenticating, while the body keeps arriving), then drains;
* ``/read`` — reads the whole body and answers its length;
* ``/sse?N`` — N body messages ``event i``, one per 5 ms tick shared by every open
  ``/sse`` stream (they all wake in the same loop turn, like servehall's streams on one
  engine step);
* ``/big?N`` — N bytes (``0123456789`` repeated) in 8 KiB body messages, no pause;
* ``/cut?N`` — N body messages, then returns without the last one (an unfinished
  response, as an application that fails mid-stream leaves it);
* ``/writes`` — how many socket writes this server has made so far (``--count-writes``).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config

_TICK: list[asyncio.Future[None]] = []


async def _tick() -> None:
    """Wait for the next shared 5 ms tick (every waiter wakes in the same loop turn)."""
    loop = asyncio.get_running_loop()
    if not _TICK or _TICK[0].done():
        fut: asyncio.Future[None] = loop.create_future()
        _TICK[:] = [fut]
        loop.call_later(0.005, fut.set_result, None)
    await _TICK[0]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    from servehall.api.body import drain_body

    path = scope["path"]
    headers: list[tuple[bytes, bytes]] = []
    if path == "/sse":
        n = int(scope["query_string"] or b"10")
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(n):
            await _tick()
            body = b"event %d\n" % i
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if path == "/cut":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(int(scope["query_string"] or b"1")):
            await send({"type": "http.response.body", "body": b"part %d\n" % i, "more_body": True})
        return
    if path == "/big":
        data = b"0123456789" * (int(scope["query_string"]) // 10)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(0, len(data), 8192):
            chunk = data[i : i + 8192]
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if path == "/writes":
        body = str(WRITES[0]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/read":
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            size += len(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        status, body = 200, str(size).encode()
    elif path == "/early":
        status, body = 415, b'{"error": "unsupported media type"}'
    elif path == "/early-close":
        if scope["query_string"] == b"slow":
            await asyncio.sleep(0.5)  # like an authentication lookup: the body keeps arriving
        status, body = 413, b'{"error": "too large"}'
        headers.append((b"connection", b"close"))
    else:
        status, body = 200, b"ok"
    headers += [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    if path.startswith("/early"):
        await drain_body(receive)


WRITES = [0]


def count_writes() -> None:
    """Count every socket transport ``write`` of this process in ``WRITES[0]``."""
    from asyncio import selector_events

    cls: Any = getattr(selector_events, "_SelectorSocketTransport")  # noqa: B009
    original = cls.write

    def write(self: Any, data: Any) -> None:
        WRITES[0] += 1
        original(self, data)

    cls.write = write


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--fixes", action="store_true")
    p.add_argument("--keep-alive", type=float, default=75.0)
    p.add_argument("--max-streams", type=int, default=100)
    p.add_argument("--drain-bytes", type=int, default=None)
    p.add_argument("--drain-s", type=float, default=None)
    p.add_argument("--count-writes", action="store_true")
    args = p.parse_args()
    if args.count_writes:
        count_writes()
    if args.fixes:
        from servehall.server.hypercorn import h1_early_response, install_connection_fixes

        install_connection_fixes()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(100)  # connections queue from here on; "ready" can be printed at once
    sock.set_inheritable(True)
    cfg = Config()
    cfg.bind = [f"fd://{sock.detach()}"]
    cfg.keep_alive_timeout = args.keep_alive
    cfg.h2_max_concurrent_streams = args.max_streams
    cfg.graceful_timeout = 30
    cfg.accesslog = None
    if args.fixes and args.drain_bytes is not None:
        setattr(cfg, h1_early_response.DRAIN_BYTES_ATTR, args.drain_bytes)
    if args.fixes and args.drain_s is not None:
        setattr(cfg, h1_early_response.DRAIN_S_ATTR, args.drain_s)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await serve(app, cfg, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()
