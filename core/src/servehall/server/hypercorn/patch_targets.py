"""What servehall's connection patches expect of Hypercorn, h2, hpack and h11, checked at start.

The eight patch modules listed in :mod:`servehall.server.hypercorn` wrap private methods
of Hypercorn 0.18, h2 4.x, hpack 4.x and h11 0.16. ``core/pyproject.toml`` pins those libraries
below their next minor release; this module is the second guard, for an install that
bypasses the pins (``--no-deps``, a vendored copy, a patched distribution): before the
patches are installed, :func:`check_patch_targets` looks at every private name a patch
wraps or calls and at a few lines of the wrapped code that the patch's reasoning relies
on, and raises :class:`PatchTargetError` naming the patch, the library version and what
changed — instead of a server that starts and then misbehaves under load.

A failed check means: read the patch module's docstring, check whether the new release
fixed the behaviour upstream (docs/api.md, "Known deviations from upstream Hypercorn",
links each upstream issue), then adapt or drop the patch and move the pin.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from servehall.errors import ServehallError

_PKG = "servehall.server.hypercorn"


class PatchTargetError(ServehallError):
    """A patched library's internals are not what a servehall patch expects."""


@dataclass(frozen=True, slots=True)
class PatchTarget:
    """One private callable a patch wraps or calls.

    Attributes:
        patch: the servehall module that patches it (for the message).
        dist: the distribution that ships it (for its version in the message).
        module / qualname: where it lives (``qualname`` may be ``Class.method``).
        snippets: source fragments the wrapped code must still contain (whitespace
            ignored); empty when the name alone is what the patch relies on.
    """

    patch: str
    dist: str
    module: str
    qualname: str
    snippets: tuple[str, ...] = ()


TARGETS: tuple[PatchTarget, ...] = (
    PatchTarget(
        "conn_release",
        "hypercorn",
        "hypercorn.asyncio.tcp_server",
        "TCPServer._read_data",
        ("self.reader.read(",),
    ),
    PatchTarget(
        "conn_release",
        "hypercorn",
        "hypercorn.asyncio.tcp_server",
        "TCPServer.protocol_send",
        ("isinstance(event, Updated)", "self.idle_task"),
    ),
    PatchTarget(
        "h1_early_response", "hypercorn", "hypercorn.protocol.h11", "H11Protocol._maybe_recycle"
    ),
    PatchTarget(
        "h1_early_response", "hypercorn", "hypercorn.protocol.h11", "H11Protocol.stream_send"
    ),
    PatchTarget(
        "h1_early_response", "hypercorn", "hypercorn.protocol.h11", "H11Protocol._close_stream"
    ),
    PatchTarget(
        "h1_early_response", "hypercorn", "hypercorn.protocol.http_stream", "HTTPStream.handle"
    ),
    PatchTarget("h1_early_response", "h11", "h11", "Connection.they_are_waiting_for_100_continue"),
    PatchTarget(
        "h2_refused_stream",
        "h2",
        "h2.connection",
        "H2Connection._receive_headers_frame",
        ("TooManyStreamsError", "_decode_headers(self.decoder"),
    ),
    PatchTarget("h2_refused_stream", "h2", "h2.connection", "_decode_headers"),
    PatchTarget("h2_refused_stream", "h2", "h2.connection", "H2Connection._get_or_create_stream"),
    PatchTarget(
        "h2_workaround",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol._handle_events",
        ("h2.events.DataReceived", "self.streams[event.stream_id].handle("),
    ),
    PatchTarget("h2_workaround", "hypercorn", "hypercorn.protocol.h2", "H2Protocol._flush"),
    PatchTarget(
        "h2_scheduler",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol.__init__",
        ("self.priority = priority.PriorityTree()",),
    ),
    PatchTarget(
        "h2_direct_data",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol.stream_send",
        (
            "isinstance(event, (Body, Data))",
            "self.stream_buffers[event.stream_id].push(event.data)",
        ),
    ),
    PatchTarget(
        "h2_direct_data",
        "hypercorn",
        "hypercorn.protocol.h2",
        "StreamBuffer.__init__",
        ("self.buffer = bytearray()", "self._complete = False"),
    ),
    PatchTarget(
        "h2_direct_data",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol._send_data",
        (
            "self.connection.local_flow_control_window(stream_id)",
            "self.connection.send_data(stream_id, data)",
        ),
    ),
    PatchTarget(
        "h2_incomplete_reset",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol.stream_send",
        ("elif isinstance(event, StreamClosed):", "await self._close_stream(event.stream_id)"),
    ),
    PatchTarget(
        "h2_incomplete_reset",
        "hypercorn",
        "hypercorn.protocol.http_stream",
        "HTTPStream.app_send",
        ("await self.send(StreamClosed(stream_id=self.stream_id))",),
    ),
    PatchTarget(
        "h2_incomplete_reset",
        "hypercorn",
        "hypercorn.protocol.h2",
        "H2Protocol._send_data",
        (
            "except (h2.exceptions.StreamClosedError, KeyError, h2.exceptions.ProtocolError):",
            "del self.stream_buffers[stream_id]",
            "self.priority.remove_stream(stream_id)",
        ),
    ),
    PatchTarget(
        "h2_direct_data",
        "h2",
        "h2.connection",
        "H2Connection.send_data",
        (
            "self.state_machine.process_input(ConnectionInputs.SEND_DATA)",
            "frames = self.streams[stream_id].send_data(",
            "self._prepare_for_sending(frames)",
            "self.outbound_flow_control_window -= frame_size",
        ),
    ),
    PatchTarget(
        "h2_direct_data",
        "h2",
        "h2.connection",
        "H2Connection._prepare_for_sending",
        ("self._data_to_send += ",),
    ),
    PatchTarget(
        "h2_direct_data",
        "h2",
        "h2.stream",
        "H2Stream.send_data",
        (
            "self.state_machine.process_input(StreamInputs.SEND_DATA)",
            "self.outbound_flow_control_window -= df.flow_controlled_length",
        ),
    ),
    PatchTarget(
        "h2_headers",
        "h2",
        "h2.stream",
        "H2Stream._build_headers_frames",
        (
            "normalize_outbound_headers(",
            "validate_outbound_headers(",
            "encoded_headers = encoder.encode(headers)",
            'frames[-1].flags.add("END_HEADERS")',
        ),
    ),
    PatchTarget(
        "h2_headers",
        "h2",
        "h2.stream",
        "H2Stream.send_headers",
        ("bytes_headers = utf8_encode_headers(headers)",),
    ),
    PatchTarget(
        "h2_headers",
        "hpack",
        "hpack.hpack",
        "Encoder.add",
        ("self.header_table.add(name, value)",),
    ),
    PatchTarget("h2_headers", "hpack", "hpack.hpack", "Encoder._encode_table_size_change"),
    PatchTarget("h2_headers", "hpack", "hpack.hpack", "encode_integer"),
    PatchTarget(
        "write_coalesce",
        "hypercorn",
        "hypercorn.asyncio.tcp_server",
        "TCPServer.protocol_send",
        ("self.writer.write(event.data)", "await self.writer.drain()"),
    ),
    PatchTarget(
        "write_coalesce",
        "hypercorn",
        "hypercorn.asyncio.tcp_server",
        "TCPServer._close",
        ("self.writer.write_eof()",),
    ),
)
"""Every private name the patches depend on (see each patch module)."""


def _dist_version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _squash(text: str) -> str:
    return "".join(text.split())


def check_patch_targets(targets: tuple[PatchTarget, ...] = TARGETS) -> None:
    """Check every target (see the module docstring).

    Raises:
        PatchTargetError: one message listing every target that is missing or whose
            code no longer contains what the patch expects, with library versions.
    """
    problems: list[str] = []
    for t in targets:
        where = f"{t.module}.{t.qualname}"
        try:
            obj: object = importlib.import_module(t.module)
            for part in t.qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            problems.append(
                f"{_PKG}.{t.patch}: {where} is missing ({t.dist} {_dist_version(t.dist)})"
            )
            continue
        if not t.snippets or str(getattr(obj, "__module__", "")).startswith("servehall."):
            continue  # nothing to compare, or already patched in this process
        try:
            source = _squash(inspect.getsource(obj))  # type: ignore[arg-type]
        except (OSError, TypeError):
            problems.append(f"{_PKG}.{t.patch}: the source of {where} cannot be read")
            continue
        for snippet in t.snippets:
            if _squash(snippet) not in source:
                problems.append(
                    f"{_PKG}.{t.patch}: {where} no longer contains {snippet!r} "
                    f"({t.dist} {_dist_version(t.dist)})"
                )
    if problems:
        raise PatchTargetError(
            "servehall's connection patches do not match the installed libraries "
            "(servehall supports hypercorn 0.18, h2 4.x, hpack 4.x, h11 0.16; see docs/api.md, "
            "'Known deviations from upstream Hypercorn'):\n  " + "\n  ".join(problems)
        )
