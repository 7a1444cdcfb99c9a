"""Listening sockets for ``server.bind``, bound the way Hypercorn binds them.

``servehall serve`` binds every ``host:port`` entry itself instead of letting Hypercorn
do it, for two reasons:

* :func:`check_binds` runs before any model is loaded, so a port already in use or an
  address the machine does not have fails in a second with one line
  (``cannot bind 127.0.0.1:8000: address already in use``), not after minutes of model
  loading with a Hypercorn traceback;
* :func:`bind_sockets` binds for real once the models are up (the port may have been
  taken in between) and hands the sockets to Hypercorn as ``fd://N`` binds, so the
  only socket creation that can fail is this one, and it raises
  :class:`~servehall.errors.ConfigError`.

Socket options match ``hypercorn.config.Config._create_sockets`` for one worker:
``AF_INET6`` when the host contains ``:``, ``TCP_NODELAY`` and ``SO_REUSEADDR`` (so a
port in ``TIME_WAIT`` after a restart is not "in use"), non-blocking, inheritable.
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Sequence

from servehall.errors import ConfigError

_REASONS: dict[int, str] = {
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "address not available on this machine",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


def split_bind(bind: str) -> tuple[str, int]:
    """``"127.0.0.1:8000"`` → ``("127.0.0.1", 8000)``; ``"[::1]:8000"`` → ``("::1", 8000)``.

    Raises:
        ConfigError: not ``host:port`` with a port in 0..65535.
    """
    host, sep, port = bind.rpartition(":")
    host = host.replace("[", "").replace("]", "")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"bind entry {bind!r} is not host:port")
    return host, int(port)


def _reason(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    if exc.errno in _REASONS:
        return _REASONS[exc.errno]
    return (exc.strerror or str(exc)).lower()


def bind_socket(bind: str, reuse_port: bool = False) -> socket.socket:
    """A bound (not yet listening) TCP socket for one ``host:port`` entry.

    ``reuse_port``: set ``SO_REUSEPORT`` first, so that more sockets can bind the same
    address (:func:`reuse_port_copies`).

    Raises:
        ConfigError: ``cannot bind HOST:PORT: REASON`` (in use, address not on this
            machine, permission, unresolvable host, ...).
    """
    host, port = split_bind(bind)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:  # e.g. IPv6 disabled: "address family not supported"
        raise ConfigError(f"cannot bind {bind}: {_reason(exc)}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.setblocking(False)
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {bind}: {_reason(exc)}") from None
    return sock


def bind_sockets(binds: Sequence[str], reuse_port: bool = False) -> list[socket.socket]:
    """Bound sockets for every entry, in order; none stays open if one fails.

    Raises:
        ConfigError: see :func:`bind_socket`.
    """
    sockets: list[socket.socket] = []
    try:
        for b in binds:
            sockets.append(bind_socket(b, reuse_port))
    except BaseException:
        for s in sockets:
            s.close()
        raise
    return sockets


def check_binds(binds: Sequence[str]) -> None:
    """Bind every entry once and close it again: fail fast before loading models.

    Raises:
        ConfigError: see :func:`bind_socket`.
    """
    for s in bind_sockets(binds):
        s.close()


def can_reuse_port() -> bool:
    """Whether this platform has ``SO_REUSEPORT`` with load balancing (Linux)."""
    return hasattr(socket, "SO_REUSEPORT") and sys.platform.startswith("linux")


def reuse_port_copies(sockets: Sequence[socket.socket]) -> list[socket.socket]:
    """One more socket bound to each of ``sockets``' addresses (bound with
    ``reuse_port``), in order: Linux spreads new connections over the listening sockets
    of one address by a hash of the connection (``SO_REUSEPORT``, socket(7)), so each
    HTTP frontend (``[server] api_processes``) gets its own accept queue. A port 0 entry
    gets the port its first socket was given.

    Raises:
        ConfigError: see :func:`bind_socket`.
    """
    binds = []
    for s in sockets:
        host, port = s.getsockname()[:2]
        binds.append(f"[{host}]:{port}" if s.family == socket.AF_INET6 else f"{host}:{port}")
    return bind_sockets(binds, reuse_port=True)


def hypercorn_fd_binds(sockets: Sequence[socket.socket]) -> list[str]:
    """Hand ``sockets`` over to Hypercorn: ``["fd://N", ...]`` for ``Config.bind``.

    The sockets are detached: Hypercorn's own socket objects own (and close) the file
    descriptors from here on.
    """
    return [f"fd://{s.detach()}" for s in sockets]
