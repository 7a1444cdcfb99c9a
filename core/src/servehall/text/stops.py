"""Stop strings matched on detokenized text, across token boundaries.

:class:`StopMatcher` is fed text as it is produced and returns only text that can no
longer be the start of a stop string: it holds back the longest suffix that is a prefix
of some stop string, so a partial stop is never sent while streaming. When a stop string
appears, everything before its first occurrence is released and the rest is dropped
(OpenAI semantics: the stop string itself is not returned).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Incremental matcher for a fixed list of non-empty stop strings.

    Cost per :meth:`feed`: O(len(held + text) × number of stops), where ``held`` is at
    most ``max(len(stop)) - 1`` characters.
    """

    __slots__ = ("_held", "_stops", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return ``(safe_text, stopped)``.

        After a stop (``stopped`` True) further feeds return ``("", True)``.
        """
        if self.stopped:
            return "", True
        buf = self._held + text
        if not self._stops:
            self._held = ""
            return buf, False
        first = -1
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            self._held = ""
            self.stopped = True
            return buf[:first], True
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        if hold:
            self._held = buf[-hold:]
            return buf[:-hold], False
        self._held = ""
        return buf, False

    def flush(self) -> str:
        """The stream ended without a stop: release whatever was held back."""
        out, self._held = self._held, ""
        return out
