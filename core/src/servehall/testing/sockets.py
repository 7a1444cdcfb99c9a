"""What the kernel says about a server's TCP sockets and descriptors (Linux ``/proc``),
for tests and benchmarks of connection handling.

* :func:`server_socket_states` — states of the sockets whose *local* port is ``port``
  (the server's side of each connection, and the listener), read from
  ``/proc/net/tcp`` and ``/proc/net/tcp6`` — what ``ss -tan sport = :PORT`` shows;
* :func:`wait_for_states` — poll until a predicate on those states holds, or time out;
* :func:`open_fds` — the number of descriptors a process has open (``/proc/PID/fd``);
* :func:`free_port` — a TCP port free on 127.0.0.1 now (the kernel's choice).

State names are the kernel's as ``ss`` prints them (``ESTABLISHED``, ``CLOSE-WAIT``,
``TIME-WAIT``, ``LISTEN`` …). Raises ``OSError`` where ``/proc`` is missing.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable

TCP_STATES: dict[int, str] = {
    0x01: "ESTABLISHED",
    0x02: "SYN-SENT",
    0x03: "SYN-RECV",
    0x04: "FIN-WAIT-1",
    0x05: "FIN-WAIT-2",
    0x06: "TIME-WAIT",
    0x07: "CLOSE",
    0x08: "CLOSE-WAIT",
    0x09: "LAST-ACK",
    0x0A: "LISTEN",
    0x0B: "CLOSING",
    0x0C: "NEW-SYN-RECV",
}


def server_socket_states(port: int) -> Counter[str]:
    """Count of sockets per state whose local port is ``port``."""
    states: Counter[str] = Counter()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                states[TCP_STATES.get(int(fields[3], 16), fields[3])] += 1
    return states


def wait_for_states(
    port: int, ok: Callable[[Counter[str]], bool], timeout: float = 10.0, step: float = 0.05
) -> tuple[bool, Counter[str]]:
    """Poll :func:`server_socket_states` until ``ok(states)`` or ``timeout`` seconds pass.
    Returns whether it held and the last states seen."""
    deadline = time.monotonic() + timeout
    while True:
        states = server_socket_states(port)
        if ok(states):
            return True, states
        if time.monotonic() > deadline:
            return False, states
        time.sleep(step)


def open_fds(pid: int) -> int:
    """Descriptors process ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bound to port 0, the kernel's choice, and
    released: another process may take it before the caller binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
