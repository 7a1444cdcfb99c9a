"""HTTP/1.1 and HTTP/2 over raw sockets, for tests of connection handling where a client
library would hide what the server did (a reset, a silent close, a refused stream).

* :func:`read_response` — one HTTP/1.1 response (``Content-Length`` bodies);
* :func:`read_until_closed` — read and drop until the server closes, or a timeout;
* :class:`H2Client` — a cleartext HTTP/2 (prior knowledge) client over one socket, built
  on the ``h2`` library, that can send many HEADERS frames in one write and reports
  responses, resets and GOAWAY as they arrive.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response with a ``Content-Length`` body from ``sock``.

    ``buf`` holds bytes already read; what is read past this response stays in it.
    Returns ``(status, headers with lower-case names, body)``. Raises ``ConnectionError``
    when the server closes (or resets) before the response is complete.
    """
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {bytes(buf)[:200]!r}")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a response body")
        rest += chunk
    buf[:] = rest[length:]
    return status, headers, rest[:length]


def read_until_closed(sock: socket.socket, timeout: float) -> bool:
    """Read and drop until the server closes the connection (True; a reset counts) or
    ``timeout`` seconds pass without it (False)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


@dataclass
class H2Stream:
    """What one stream got: ``status`` (0 before headers), ``body``, ``ended``, and
    ``reset`` (the RST_STREAM error code, or None)."""

    status: int = 0
    body: bytes = b""
    ended: bool = False
    reset: int | None = None


@dataclass
class H2Client:
    """Cleartext HTTP/2 with prior knowledge over ``sock`` (see the module docstring).

    ``streams`` maps stream ids to :class:`H2Stream`; ``terminated`` is the GOAWAY error
    code once the server sent one; ``closed`` is True once the server closed the socket.
    """

    sock: socket.socket
    conn: h2.connection.H2Connection = field(init=False)
    streams: dict[int, H2Stream] = field(default_factory=dict)
    terminated: int | None = None
    closed: bool = False
    server_max_streams: int | None = None

    def __post_init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def read_settings(self) -> int:
        """Wait for the server's SETTINGS; return its ``MAX_CONCURRENT_STREAMS``."""
        while self.server_max_streams is None:
            if not self.pump():
                raise ConnectionError("closed before SETTINGS")
        return self.server_max_streams

    def allow_streams(self, n: int) -> None:
        """Let this client open ``n`` streams whatever the server advertised (``h2``
        enforces the server's limit on the client side)."""
        self.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = n
        self.conn.remote_settings.acknowledge()

    def request(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]] | None = None,
        body: bytes | None = None,
        *,
        flush: bool = True,
    ) -> int:
        """Start a request (HEADERS, and DATA when ``body`` is given); returns its stream
        id. With ``flush=False`` the frames wait for the next :meth:`flush` — unless the
        body does not fit the flow-control windows: then what is pending is sent and the
        server's frames are read until its ``WINDOW_UPDATE`` makes room, as a client
        must (a window the server returns after answering an earlier stream arrives
        after that answer)."""
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "x")]
        self.conn.send_headers(sid, hdrs + list(headers or []), end_stream=body is None)
        self.streams[sid] = H2Stream()
        if body is not None:  # in frames of the largest size the server accepts
            size = self.conn.max_outbound_frame_size
            parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
            for i, part in enumerate(parts):
                while self.conn.local_flow_control_window(sid) < len(part):
                    self.flush()
                    if not self.pump():
                        raise ConnectionError("closed while waiting for a flow-control window")
                self.conn.send_data(sid, part, end_stream=i == len(parts) - 1)
        if flush:
            self.flush()
        return sid

    def flush(self) -> None:
        """Send every pending frame in one write."""
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self) -> bool:
        """Read once and process the frames; False once the server closed the socket."""
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return False
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                cs = ev.changed_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
                if cs is not None:
                    self.server_max_streams = cs.new_value
            elif isinstance(ev, h2.events.ResponseReceived) and ev.stream_id in self.streams:
                self.streams[ev.stream_id].status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived) and ev.stream_id in self.streams:
                self.streams[ev.stream_id].body += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in self.streams:
                self.streams[ev.stream_id].ended = True
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id in self.streams:
                self.streams[ev.stream_id].reset = int(ev.error_code or 0)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.terminated = int(ev.error_code or 0)
        self.flush()
        return True

    def wait(self, sids: list[int]) -> bool:
        """Pump until every stream of ``sids`` ended or was reset; False when the
        connection ended first (GOAWAY or close)."""
        while not all(self.streams[s].ended or self.streams[s].reset is not None for s in sids):
            if self.terminated is not None or not self.pump():
                return False
        return True


def h2_connection_pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    """An in-memory HTTP/2 client and server connection (h2's, no sockets) with their
    prefaces and settings exchanged; the server keeps header names and values as bytes
    (``header_encoding=None``, as Hypercorn configures it). Frames move between them by
    ``receive_data(other.data_to_send())``."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server
