"""HTTP/2 response headers in one pass, and the request id kept out of HPACK's table.

Every response's header block went through h2's outbound header pipeline: with h2's
defaults (``normalize_outbound_headers`` and ``validate_outbound_headers`` on) ten
chained generators — lower-case the names, strip whitespace, drop connection headers,
mark ``authorization`` / short ``cookie`` never-indexed, reject ``te``, connection and
out-of-place or unknown pseudo-header fields, check ``:path`` and ``:authority`` — and
then hpack's encoder, which Huffman-codes every literal in pure Python and adds it to
the dynamic table. A profile of the API process under one-token requests
(docs/performance.md, "A cheaper request") had that ``send_headers`` path at about 9 %
of its CPU, the Huffman coding of the one value that differs in every response — the
``x-request-id`` — and the linear search of a dynamic table that those ids filled being
the largest parts.

:func:`install` wraps h2's ``H2Stream._build_headers_frames`` for a server's response
header block (not trailers, not a client's request) that is already in the form the
pipeline produces: a ``:status`` first, no other pseudo-header, names lower case, no
surrounding whitespace, plain tuples, and none of the names the pipeline changes or
checks (connection headers, ``te``, ``authorization``, ``proxy-authorization``,
``cookie``). For such a block every stage of the pipeline hands each header on
unchanged, so it is skipped: the same headers reach the encoder. Any other block takes
h2's own path.

In that same block, the names in :data:`UNINDEXED` are encoded as HPACK literals
*without indexing* and without Huffman coding of the value (RFC 7541 §6.2.2, §5.2): a
value that never repeats gains nothing from the table (it only evicts the headers that
do repeat, and makes every search longer) nor much from Huffman (a hex id shrinks by a
quarter). The other headers are encoded exactly as before. The client decodes the same
header list. Idempotent.
"""

from __future__ import annotations

from typing import Any

from hpack import Encoder
from hpack.hpack import encode_integer

UNINDEXED: frozenset[bytes] = frozenset({b"x-request-id"})
"""Response header names whose value is unique per response (see the module docstring)."""

_CHANGED_OR_CHECKED = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"transfer-encoding",
        b"upgrade",
        b"te",
        b"authorization",
        b"proxy-authorization",
        b"cookie",
    }
)
"""Names h2's outbound pipeline drops, rejects or re-types (h2.utilities
``CONNECTION_HEADERS``, ``_reject_te``, ``_SECURE_HEADERS``, the short-cookie rule): a
block with one of them takes h2's own path."""

_INSTALLED = False


def already_normal(headers: list[Any]) -> bool:
    """Whether h2's outbound normalisation and validation would pass ``headers`` (a
    response header block: ``(name, value)`` bytes tuples) through unchanged and
    without error: ``:status`` first and no other pseudo-header, every item a plain
    ``tuple``, lower-case names, no surrounding whitespace in names or values, no name
    in ``_CHANGED_OR_CHECKED``. False means "not known": h2's own path decides."""
    if not headers:
        return False
    first = headers[0]
    if type(first) is not tuple or first[0] != b":status":
        return False
    for i, header in enumerate(headers):
        if type(header) is not tuple or len(header) != 2:
            return False
        name, value = header
        if i and name[:1] == b":":
            return False
        if not name.islower() or name in _CHANGED_OR_CHECKED:
            return False
        if name.strip() != name or value.strip() != value:
            return False
    return True


def _literal_name(name: bytes) -> bytes:
    """The head of a literal-without-indexing field with a new name (RFC 7541 §6.2.2:
    ``0000 0000``, then the Huffman-coded name with its length)."""
    coded = Encoder().huffman_coder.encode(name)
    size = encode_integer(len(coded), 7)
    size[0] |= 0x80
    return b"\x00" + bytes(size) + coded


_NAME_HEADS: dict[bytes, bytes] = {name: _literal_name(name) for name in UNINDEXED}


def encode_response(encoder: Encoder, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The HPACK block of ``headers`` (see :func:`already_normal`) from ``encoder``: as
    ``encoder.encode(headers)`` (a pending table-size update first, Huffman on, each
    header looked up and added to the dynamic table), except the names in
    :data:`UNINDEXED`: a literal without indexing, the value not Huffman-coded."""
    parts: list[bytes] = []
    if encoder.header_table.resized:
        parts.append(encoder._encode_table_size_change())
        encoder.header_table.resized = False
    for name, value in headers:
        head = _NAME_HEADS.get(name)
        if head is None:
            parts.append(encoder.add((name, value), False, True))
        else:
            parts.append(head + bytes(encode_integer(len(value), 7)) + value)
    return b"".join(parts)


def install() -> None:
    """Wrap h2's ``H2Stream._build_headers_frames`` once per process (see the module
    docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from h2.stream import H2Stream
    from hyperframe.frame import ContinuationFrame

    original = H2Stream._build_headers_frames

    def _build_headers_frames(
        self: Any, headers: Any, encoder: Any, first_frame: Any, hdr_validation_flags: Any
    ) -> Any:
        config = self.config
        if not (
            hdr_validation_flags.is_response_header
            and not hdr_validation_flags.is_trailer
            and not hdr_validation_flags.is_push_promise
            and not config.client_side
            and config.normalize_outbound_headers
            and config.validate_outbound_headers
            and not config.split_outbound_cookies
            and type(headers) is list
            and already_normal(headers)
        ):
            return original(self, headers, encoder, first_frame, hdr_validation_flags)
        block = encode_response(encoder, headers)
        # as h2 slices the block: max_outbound_frame_size bytes per frame
        size = self.max_outbound_frame_size or 0
        first_frame.data = block[:size]
        frames = [first_frame]
        for i in range(size, len(block), size):
            cf = ContinuationFrame(self.stream_id)
            cf.data = block[i : i + size]
            frames.append(cf)
        frames[-1].flags.add("END_HEADERS")
        return frames

    H2Stream._build_headers_frames = _build_headers_frames  # type: ignore[method-assign]
    _INSTALLED = True
