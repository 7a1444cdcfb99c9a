"""Every correction servehall applies to Hypercorn's connection handling, in one call.

Each lives in its own module with the Hypercorn/h2 behaviour it corrects, the case that
shows it and the upstream reference (docs/api.md, "Known deviations from upstream
Hypercorn"):

* :mod:`servehall.server.hypercorn.conn_release` — a connection the client closed is released at
  once, not after ``keep_alive_timeout`` (no ``CLOSE-WAIT``; N29, N32);
* :mod:`servehall.server.hypercorn.h1_early_response` — an HTTP/1.1 answer sent before the request
  body arrived either reads and drops the body and keeps the connection, or says
  ``Connection: close`` and lingers, reading, before it closes (N27, N28, issue 16 item 5);
* :mod:`servehall.server.hypercorn.h2_refused_stream` — an HTTP/2 stream over
  ``MAX_CONCURRENT_STREAMS`` is refused alone with ``RST_STREAM(REFUSED_STREAM)`` (N11);
* :mod:`servehall.server.hypercorn.h2_workaround` — late DATA frames after an early HTTP/2 answer do
  not drop the connection;
* :mod:`servehall.server.hypercorn.h2_direct_data` — an HTTP/2 body message that can leave
  at once (nothing of its stream buffered, within the window and the frame size) is framed
  at once instead of through the buffer and the sender task (a profiled cost);
* :mod:`servehall.server.hypercorn.h2_incomplete_reset` — an HTTP/2 response the
  application leaves unfinished is reset with ``RST_STREAM(INTERNAL_ERROR)`` instead of
  staying open until the connection ends;
* :mod:`servehall.server.hypercorn.h2_headers` — a response header block already in h2's
  normal form skips h2's outbound header pipeline, and the ``x-request-id`` is sent as an
  HPACK literal without indexing or Huffman coding (a profiled cost);
* :mod:`servehall.server.hypercorn.h2_scheduler` — HTTP/2 sends go round robin over the streams with
  data instead of through the deprecated RFC 7540 priority tree (a profiled cost);
* :mod:`servehall.server.hypercorn.write_coalesce` — the frames sent in one event-loop turn
  leave in one socket write per connection, not one ``send(2)`` per HTTP/2 frame (a
  profiled cost).
"""

from __future__ import annotations

from servehall.server.hypercorn import (
    conn_release,
    h1_early_response,
    h2_direct_data,
    h2_headers,
    h2_incomplete_reset,
    h2_refused_stream,
    h2_scheduler,
    h2_workaround,
    write_coalesce,
)
from servehall.server.hypercorn.patch_targets import check_patch_targets


def install_connection_fixes() -> None:
    """Install all of them (process-wide, idempotent). Call before Hypercorn serves.

    Raises:
        PatchTargetError: the installed Hypercorn/h2/h11 are not what the patches expect
            (:func:`servehall.server.hypercorn.patch_targets.check_patch_targets`).
    """
    check_patch_targets()
    conn_release.install()
    h1_early_response.install()
    h2_refused_stream.install()
    h2_workaround.install()
    h2_scheduler.install()
    h2_headers.install()
    h2_direct_data.install()
    h2_incomplete_reset.install()
    write_coalesce.install()
