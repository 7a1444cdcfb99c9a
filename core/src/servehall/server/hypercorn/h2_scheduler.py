"""HTTP/2 send scheduling: round robin over the streams that have data, in O(1).

Hypercorn's HTTP/2 protocol picks the next stream to send from with the ``priority``
package's ``PriorityTree`` (RFC 7540 §5.3 dependency tree and weights). A profile of
servehall under 16 concurrent streams on one connection (``servehall bench serve``,
``docs/performance.md``) showed that tree's heap operations — about ten comparisons and
two heap operations per DATA frame, growing with the number of open streams — among the
largest single costs of the API process.

RFC 9113 §5.3 deprecates the RFC 7540 priority scheme, and servers may ignore priority
signals (§5.3.2); clients moved to RFC 9218's extensible priorities, which Hypercorn
does not implement. :class:`RoundRobinStreams` keeps the interface Hypercorn calls
(``insert_stream``, ``remove_stream``, ``block``, ``unblock``, ``reprioritize``,
``next()``, and the same exceptions) and serves the unblocked streams in turn: every
stream with data gets one frame before any gets a second, which is also what the tree
does for streams of equal weight (the only kind a client that sends no PRIORITY frames
has). :func:`install` makes every new Hypercorn ``H2Protocol`` use it. Idempotent.
"""

from __future__ import annotations

from typing import Any

import priority

_INSTALLED = False


class RoundRobinStreams:
    """The unblocked streams of one connection in round-robin order (see the module
    docstring). Stream ids are HTTP/2 stream identifiers (ints).

    Raises (as ``priority.PriorityTree`` does): ``priority.DuplicateStreamError`` on
    inserting a known stream, ``priority.MissingStreamError`` on any other call naming
    an unknown stream, ``priority.DeadlockError`` from ``next()`` when no stream is
    unblocked.
    """

    __slots__ = ("_active", "_known")

    def __init__(self) -> None:
        self._known: set[int] = set()
        self._active: dict[int, None] = {}  # insertion-ordered: the round-robin queue

    def insert_stream(
        self,
        stream_id: int,
        depends_on: int | None = None,
        weight: int = 16,
        exclusive: bool = False,
    ) -> None:
        """Add a stream, unblocked (as the tree does). Priority arguments are ignored."""
        if stream_id in self._known:
            raise priority.DuplicateStreamError(stream_id)
        self._known.add(stream_id)
        self._active[stream_id] = None

    def reprioritize(
        self,
        stream_id: int,
        depends_on: int | None = None,
        weight: int = 16,
        exclusive: bool = False,
    ) -> None:
        """Accept a PRIORITY frame for a known stream and ignore it (RFC 9113 §5.3.2)."""
        if stream_id not in self._known:
            raise priority.MissingStreamError(stream_id)

    def remove_stream(self, stream_id: int) -> None:
        """Forget a stream."""
        if stream_id not in self._known:
            raise priority.MissingStreamError(stream_id)
        self._known.discard(stream_id)
        self._active.pop(stream_id, None)

    def block(self, stream_id: int) -> None:
        """The stream has nothing to send: skip it until :meth:`unblock`."""
        if stream_id not in self._known:
            raise priority.MissingStreamError(stream_id)
        self._active.pop(stream_id, None)

    def unblock(self, stream_id: int) -> None:
        """The stream has data again: it joins the end of the round."""
        if stream_id not in self._known:
            raise priority.MissingStreamError(stream_id)
        if stream_id not in self._active:
            self._active[stream_id] = None

    def __iter__(self) -> RoundRobinStreams:
        return self

    def __next__(self) -> int:
        """The next unblocked stream (it moves to the end of the round)."""
        active = self._active
        for stream_id in active:
            del active[stream_id]
            active[stream_id] = None
            return stream_id
        raise priority.DeadlockError("no unblocked streams")


def install() -> None:
    """Make Hypercorn's ``H2Protocol`` schedule its sends with :class:`RoundRobinStreams`
    (once per process; see the module docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.protocol.h2 import H2Protocol

    original_init = H2Protocol.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.priority = RoundRobinStreams()

    H2Protocol.__init__ = __init__  # type: ignore[method-assign]
    _INSTALLED = True
