"""Tests of servehall.testing.sockets: socket states read from ``/proc/net/tcp*`` for
real sockets made here (a listener, an established pair, a half-closed one), polling
for a state, descriptor counts, free ports."""

from __future__ import annotations

import os
import socket
import time

import pytest

from servehall.testing.sockets import (
    TCP_STATES,
    free_port,
    open_fds,
    server_socket_states,
    wait_for_states,
)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")


def test_states_of_a_listener_and_its_connections() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert server_socket_states(port)["LISTEN"] == 0  # bound, not listening yet
        listener.listen()
        assert server_socket_states(port) == {"LISTEN": 1}
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        try:
            states = server_socket_states(port)
            # only the server's side counts: the client's local port is another one
            assert states == {"LISTEN": 1, "ESTABLISHED": 1}
            client.close()  # the server's side, not closed, waits in CLOSE-WAIT
            ok, states = wait_for_states(port, lambda s: s["CLOSE-WAIT"] == 1, timeout=5)
            assert ok and states["ESTABLISHED"] == 0
        finally:
            server.close()


def test_wait_for_states_times_out_with_the_last_states() -> None:
    port = free_port()
    t0 = time.monotonic()
    ok, states = wait_for_states(port, lambda s: s["LISTEN"] == 1, timeout=0.2, step=0.05)
    assert not ok and states["LISTEN"] == 0
    assert 0.2 <= time.monotonic() - t0 < 2


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_open_fds_counts_new_descriptors() -> None:
    before = open_fds(os.getpid())
    r, w = os.pipe()
    try:
        assert open_fds(os.getpid()) == before + 2
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(OSError):
        open_fds(2**22 + 12345)  # no such process


def test_state_names_are_ss_names() -> None:
    assert TCP_STATES[0x01] == "ESTABLISHED" and TCP_STATES[0x0A] == "LISTEN"
    assert TCP_STATES[0x08] == "CLOSE-WAIT" and TCP_STATES[0x06] == "TIME-WAIT"
    assert len(set(TCP_STATES.values())) == len(TCP_STATES)
