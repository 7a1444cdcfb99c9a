"""Tests of servehall.testing.rawhttp: HTTP/1.1 responses read from a socket pair, and the
raw HTTP/2 client against a real HTTP/2 peer (the ``h2`` library's server side on a
thread) that answers, resets, reads a body and sends GOAWAY."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from servehall.testing.rawhttp import H2Client, read_response, read_until_closed


def test_read_response_keeps_what_follows() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        )
        buf = bytearray()
        assert read_response(a, buf) == (404, {"content-length": "5", "x-a": "1"}, b"hello")
        assert read_response(a, buf) == (200, {"content-length": "0"}, b"")
        assert buf == b""


def test_read_response_raises_on_an_early_close() -> None:
    a, b = socket.socketpair()
    with a:
        b.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        b.close()
        with pytest.raises(ConnectionError, match="inside a response body"):
            read_response(a, bytearray())
    a, b = socket.socketpair()
    with a:
        b.sendall(b"HTTP/1.1 2")
        b.close()
        with pytest.raises(ConnectionError, match="closed before a response"):
            read_response(a, bytearray())


def test_read_until_closed() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x" * 1000)
        assert read_until_closed(a, timeout=0.1) is False  # still open
        b.close()
        assert read_until_closed(a, timeout=5) is True


class H2Peer:
    """An HTTP/2 server on one accepted connection: ``GET /ok`` → 200 ``ok``; ``/reset``
    → RST_STREAM(REFUSED_STREAM); ``POST /len`` → 200 with the body's length;
    ``/bye`` → GOAWAY."""

    def __init__(self, sock: socket.socket, max_streams: int) -> None:
        self.sock = sock
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams},
        )
        self.bodies: dict[int, bytes] = {}
        self.paths: dict[int, str] = {}

    def run(self) -> None:
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        while data := self.sock.recv(65536):
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    self.paths[ev.stream_id] = dict(ev.headers)[b":path"].decode()
                    self.bodies[ev.stream_id] = b""
                elif isinstance(ev, h2.events.DataReceived):
                    self.bodies[ev.stream_id] += ev.data
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    self._answer(ev.stream_id)
            self.sock.sendall(self.conn.data_to_send())
            if self.conn.state_machine.state == h2.connection.ConnectionState.CLOSED:
                break
        self.sock.close()

    def _answer(self, sid: int) -> None:
        path = self.paths[sid]
        if path == "/reset":
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif path == "/bye":
            self.conn.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            body = str(len(self.bodies[sid])).encode() if path == "/len" else b"ok"
            self.conn.send_headers(sid, [(":status", "200")])
            self.conn.send_data(sid, body, end_stream=True)


@pytest.fixture
def client() -> Iterator[H2Client]:
    a, b = socket.socketpair()
    peer = H2Peer(b, max_streams=3)
    thread = threading.Thread(target=peer.run, daemon=True)
    thread.start()
    a.settimeout(10)
    yield H2Client(a)
    a.close()
    thread.join(5)


def test_h2_client_requests_resets_and_bodies(client: H2Client) -> None:
    assert client.read_settings() == 3
    ok = client.request("GET", "/ok")
    refused = client.request("GET", "/reset")
    big = client.request("POST", "/len", body=b"z" * 100_000)  # past the 64 KiB window
    assert client.wait([ok, refused, big])
    assert (client.streams[ok].status, client.streams[ok].body) == (200, b"ok")
    assert client.streams[refused].reset == h2.errors.ErrorCodes.REFUSED_STREAM
    assert client.streams[big].body == b"100000" and client.streams[big].ended


def test_h2_client_batches_requests_in_one_write(client: H2Client) -> None:
    limit = client.read_settings()
    sids = [client.request("GET", "/ok", flush=False) for _ in range(limit)]
    client.flush()
    assert client.wait(sids)
    assert [client.streams[s].status for s in sids] == [200] * limit


def test_allow_streams_lifts_the_clients_own_limit(client: H2Client) -> None:
    import h2.exceptions

    limit = client.read_settings()
    for _ in range(limit):
        client.request("GET", "/ok", flush=False)
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        client.request("GET", "/ok", flush=False)  # h2 enforces the server's limit
    client.allow_streams(limit + 1)
    client.request("GET", "/ok", flush=False)  # now the client may open one more


def test_h2_client_sees_goaway(client: H2Client) -> None:
    client.read_settings()
    sid = client.request("GET", "/bye")
    assert client.wait([sid]) is False
    assert client.terminated == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
