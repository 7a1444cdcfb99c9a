"""Tests of servehall.server.listeners: parsing ``host:port`` binds and binding real
sockets the way Hypercorn does, with one-line ConfigErrors."""

from __future__ import annotations

import os
import re
import socket

import pytest

from servehall import ConfigError
from servehall.server.listeners import (
    bind_socket,
    bind_sockets,
    check_binds,
    hypercorn_fd_binds,
    split_bind,
)
from servehall.testing.sockets import free_port


@pytest.mark.parametrize(
    ("bind", "want"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]:8000", ("::1", 8000)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_split_bind(bind: str, want: tuple[str, int]) -> None:
    assert split_bind(bind) == want


@pytest.mark.parametrize(
    "bind", ["8000", ":8000", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:65536", "h:-1", "[]:80"]
)
def test_split_bind_refuses(bind: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"bind entry {bind!r} is not host:port")):
        split_bind(bind)


def test_bound_socket_has_hypercorns_options() -> None:
    sock = bind_socket("127.0.0.1:0")
    try:
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        assert not sock.getblocking() and sock.get_inheritable()
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_ipv6_host_gets_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        sock = bind_socket("[::1]:0")
    except ConfigError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    with sock:
        assert sock.family == socket.AF_INET6


def test_port_in_use_is_one_line() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(
            ConfigError, match=f"^cannot bind 127.0.0.1:{port}: address already in use$"
        ):
            bind_socket(f"127.0.0.1:{port}")
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("bind", "reason"),
    [
        ("192.0.2.1:0", "address not available on this machine"),  # TEST-NET-1, not ours
        ("no-such-host.invalid:0", "cannot resolve the host"),
    ],
)
def test_other_bind_failures(bind: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=f"cannot bind {bind}: {reason}"):
        bind_socket(bind)


def test_privileged_port_without_privileges() -> None:
    if os.geteuid() == 0:
        pytest.skip("root may bind low ports")
    with pytest.raises(ConfigError, match="permission denied"):
        bind_socket("127.0.0.1:1")


def test_bind_sockets_closes_the_earlier_ones_when_one_fails() -> None:
    port = free_port()
    with pytest.raises(ConfigError, match="is not host:port"):
        bind_sockets([f"127.0.0.1:{port}", "bad"])
    # the first port was released: binding it again (listening) works
    again = bind_socket(f"127.0.0.1:{port}")
    again.listen()
    again.close()


def test_check_binds_leaves_nothing_bound() -> None:
    port = free_port()
    check_binds([f"127.0.0.1:{port}"])
    check_binds([f"127.0.0.1:{port}"])  # still free
    holder = bind_socket(f"127.0.0.1:{port}")
    holder.listen()
    try:
        with pytest.raises(ConfigError, match="address already in use"):
            check_binds([f"127.0.0.1:{port}"])
    finally:
        holder.close()


def test_hypercorn_fd_binds_detach_the_sockets() -> None:
    socks = bind_sockets(["127.0.0.1:0", "127.0.0.1:0"])
    ports = [s.getsockname()[1] for s in socks]
    binds = hypercorn_fd_binds(socks)
    assert all(s.fileno() == -1 for s in socks)  # detached: no longer owned
    fds = [int(b.removeprefix("fd://")) for b in binds]
    for fd, port in zip(fds, ports, strict=True):
        with socket.socket(fileno=fd) as owner:  # the descriptor is still open
            assert owner.getsockname()[1] == port
