"""The HAProxy agent endpoint of a replica (``[server] agent_bind``).

HAProxy's ``agent-check`` (``server … agent-check agent-port P agent-inter 1s``) opens a
TCP connection to this port every ``agent-inter``, reads one line and closes it. The line
(HAProxy 2.x configuration manual, "agent-check") is:

* ``down`` — no model is ready (``/health/ready`` would be 503): take the server out;
* ``drain`` — the replica is draining after SIGTERM: no new requests, existing ones finish;
* ``up ready W%`` — otherwise, with the weight ``W`` from the replica's load.

The weight: for each served model, ``kv`` = KV-cache blocks used / total and ``queue`` =
(engine running + engine waiting + admission-queue waiting) / ``[scheduler]
max_concurrency``, capped at 1; the replica's load is the largest ``max(kv, queue)`` over
its models, and ``W = max(1, round(100 × (1 − load)))``. An idle replica answers 100 %, one
whose KV cache is full or whose slots are all taken 1 % (never 0 %: HAProxy treats 0 as
drain, and a merely busy replica must still get work when all are busy). HAProxy scales
the configured ``weight`` by ``W`` %; with ``balance leastconn`` or ``roundrobin`` new
requests then go mostly to the replicas with room.

Stale signals never fail closed: the answer is computed from in-process state when asked;
if this port does not answer (the process hangs), HAProxy keeps the last weight it read
and the HTTP health check (``/health/ready``) decides whether the server is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servehall.plugin.host import Host
    from servehall.serving.probe import Readiness

log = logging.getLogger("servehall.agent")


def replica_load(host: Host) -> float:
    """The replica's load in [0, 1] (module docstring): the largest ``max(kv, queue)``
    over its models; 0 with no model."""
    slots = max(1, host.settings.scheduler.max_concurrency)
    load = 0.0
    for served in host.models.values():
        try:
            s = served.engine.stats()
        except Exception:  # an engine that cannot say counts as full
            return 1.0
        kv = s.kv_cache_usage
        queue = (s.running + s.waiting + served.scheduler.waiting) / slots
        load = max(load, kv, min(1.0, queue))
    return min(1.0, load)


def agent_weight(host: Host) -> int:
    """The weight percentage ``max(1, round(100 × (1 − load)))`` (module docstring)."""
    return max(1, round(100 * (1.0 - replica_load(host))))


async def agent_answer(host: Host, readiness: Readiness, draining: Callable[[], bool]) -> str:
    """The agent line for now: ``drain``, ``down`` or ``up ready W%`` (no newline)."""
    if draining():
        return "drain"
    ready, _ = await readiness.report()
    if not ready:
        return "down"
    return f"up ready {agent_weight(host)}%"


class AgentServer:
    """A TCP server on ``bind`` (``host:port``) answering :func:`agent_answer` to every
    connection (see the module docstring)."""

    def __init__(
        self, host: Host, readiness: Readiness, draining: Callable[[], bool], bind: str
    ) -> None:
        self.host = host
        self.readiness = readiness
        self.draining = draining
        self.bind = bind
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on :attr:`bind`.

        Raises:
            OSError: the address cannot be bound (in use, not local).
        """
        addr, _, port = self.bind.rpartition(":")
        self._server = await asyncio.start_server(
            self._serve, addr.strip("[]") or "0.0.0.0", int(port)
        )
        log.info("HAProxy agent answering on %s", self.bind)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await agent_answer(self.host, self.readiness, self.draining)
        except Exception:  # never leave HAProxy without an answer; it keeps the last weight
            log.exception("agent answer failed")
            line = "up"
        with contextlib.suppress(ConnectionError):
            writer.write(line.encode("ascii") + b"\n")
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
