"""One request's hop to the engine worker and back: the worker's transport
(:mod:`servehall.worker.wire`, length-prefixed msgspec frames on two Unix sockets) against
ZeroMQ ``ipc://`` (the transport before it) and a bare Unix socket, back to back and with
idle gaps between messages.

Usage (the ZeroMQ column needs ``pip install pyzmq``, no longer a dependency)::

    python bench/bench_ipc_hop.py [-n 1500] [--gaps-ms 0,2]

A spawned echo process answers each 100-byte message; the round trip (send, then await
the answer on the event loop) is timed in the parent. The ZeroMQ pair is the one the
worker uses (PUSH/PULL over ``ipc://``, ``zmq.asyncio`` on both ends); the Unix socket
is the floor (a stream socket with ``loop.add_reader``, one ``send``/``recv`` per
message, no framing: a reference, not a transport). With a gap between messages (as with
sequential requests) the CPUs go idle in between, and every thread a message passes
through must be woken: ZeroMQ passes through an I/O thread on each side. The wire
transport is measured as the worker uses it: the parent writes a framed command on an
asyncio stream, the echo reads it with ``read_frame`` on its loop and answers with a
``FrameSender`` (blocking ``sendall``) on the second socket, the parent reads the answer
with ``read_frame``. The three are alternated within one run. Figures:
docs/performance.md ("Where the worker hop's time goes").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import socket
import tempfile
import time
from pathlib import Path

import msgspec

MESSAGE = b"x" * 100


def _echo_zmq(push_to: str, pull_from: str) -> None:
    import zmq
    import zmq.asyncio

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pull = ctx.socket(zmq.PULL)
        pull.connect(pull_from)
        push = ctx.socket(zmq.PUSH)
        push.connect(push_to)
        while True:
            m = await pull.recv()
            if m == b"q":
                break
            await push.send(m)

    asyncio.run(main())


def _echo_unix(path: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.setblocking(False)
        done: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            m = s.recv(4096)
            if not m or m == b"q":
                if not done.done():
                    done.set_result(None)
                return
            s.send(m)

        loop.add_reader(s.fileno(), ready)
        await done

    asyncio.run(main())


def _echo_wire(path: str) -> None:
    from servehall.worker.wire import FrameSender, read_frame

    async def main() -> None:
        cmd = socket.socket(socket.AF_UNIX)
        cmd.connect(path)
        rep = socket.socket(socket.AF_UNIX)
        rep.connect(path)
        sender = FrameSender(rep)
        reader, _writer = await asyncio.open_unix_connection(sock=cmd)
        while True:
            m = await read_frame(reader)
            if m == b"q":
                break
            sender.send(msgspec.Raw(m))
        sender.close()

    asyncio.run(main())


def _quantiles(lat: list[float]) -> tuple[float, float]:
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


async def _round_trips_zmq(work: Path, n: int, gap: float) -> tuple[float, float]:
    import zmq
    import zmq.asyncio

    a, b = f"ipc://{work}/a", f"ipc://{work}/b"
    ctx = zmq.asyncio.Context()
    push = ctx.socket(zmq.PUSH)
    push.bind(a)
    pull = ctx.socket(zmq.PULL)
    pull.bind(b)
    proc = mp.get_context("spawn").Process(target=_echo_zmq, args=(b, a))
    proc.start()
    lat: list[float] = []
    for i in range(n + 50):
        if gap:
            await asyncio.sleep(gap)
        t = time.perf_counter()
        await push.send(MESSAGE)
        await pull.recv()
        if i >= 50:
            lat.append(time.perf_counter() - t)
    await push.send(b"q")
    proc.join(10)
    ctx.destroy(linger=0)
    return _quantiles(lat)


async def _round_trips_unix(work: Path, n: int, gap: float) -> tuple[float, float]:
    path = str(work / "u.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    proc = mp.get_context("spawn").Process(target=_echo_unix, args=(path,))
    proc.start()
    conn, _ = server.accept()
    conn.setblocking(False)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes] | None = None

    def ready() -> None:
        m = conn.recv(4096)
        if answer is not None and not answer.done():
            answer.set_result(m)

    loop.add_reader(conn.fileno(), ready)
    lat: list[float] = []
    for i in range(n + 50):
        if gap:
            await asyncio.sleep(gap)
        answer = loop.create_future()
        t = time.perf_counter()
        conn.send(MESSAGE)
        await answer
        if i >= 50:
            lat.append(time.perf_counter() - t)
    loop.remove_reader(conn.fileno())
    conn.close()
    proc.join(10)
    server.close()
    return _quantiles(lat)


async def _round_trips_wire(work: Path, n: int, gap: float) -> tuple[float, float]:
    from servehall.worker.wire import frame, read_frame

    path = str(work / "w.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(2)
    server.setblocking(False)
    loop = asyncio.get_running_loop()
    proc = mp.get_context("spawn").Process(target=_echo_wire, args=(path,))
    proc.start()
    cmd, _ = await loop.sock_accept(server)
    rep, _ = await loop.sock_accept(server)
    _r, writer = await asyncio.open_unix_connection(sock=cmd)
    reader, _w = await asyncio.open_unix_connection(sock=rep)
    payload = msgspec.msgpack.encode(MESSAGE)
    lat: list[float] = []
    for i in range(n + 50):
        if gap:
            await asyncio.sleep(gap)
        t = time.perf_counter()
        writer.write(frame(payload))
        await read_frame(reader)
        if i >= 50:
            lat.append(time.perf_counter() - t)
    writer.write(frame(b"q"))
    proc.join(10)
    writer.close()
    server.close()
    return _quantiles(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1500, help="round trips per measurement")
    ap.add_argument("--gaps-ms", default="0,2", help="idle gaps between messages (ms)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the three")
    args = ap.parse_args()
    # ZeroMQ is the reference the transport was chosen against, no longer a dependency:
    # `pip install pyzmq` to measure it
    has_zmq = importlib.util.find_spec("zmq") is not None
    print(
        "| gap between messages | round | wire (length-prefixed frames) RTT P50 / P99 (µs) "
        "| ZeroMQ ipc RTT P50 / P99 (µs) | bare Unix socket RTT P50 / P99 (µs) |"
    )
    print("|---|---:|---:|---:|---:|")
    for gap_ms in (float(g) for g in args.gaps_ms.split(",")):
        for r in range(args.rounds):
            row = []
            for fn in (_round_trips_wire, _round_trips_zmq, _round_trips_unix):
                if fn is _round_trips_zmq and not has_zmq:
                    row.append("pyzmq not installed")
                    continue
                with tempfile.TemporaryDirectory() as d:
                    q = asyncio.run(fn(Path(d), args.n, gap_ms / 1000))
                row.append(f"{q[0]:.0f} / {q[1]:.0f}")
            print(f"| {gap_ms:g} ms | {r + 1} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
