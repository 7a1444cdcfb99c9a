"""Test and benchmark helpers: build a policy book from keyword config, drive a stream
filter the way the host does. Shipped (like httpx's mock transport) so e2e tests and
benchmarks of other packages can use them; never used on the request path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servehall import FilterVerdict
from servehall_safety_filter.policy import PolicyBook
from servehall_safety_filter.settings import SafetyFilterSettings
from servehall_safety_filter.stream import SafetyStreamFilter


def book(**cfg: Any) -> PolicyBook:
    """A compiled PolicyBook from ``[safety_filter]`` keyword arguments."""
    return PolicyBook(SafetyFilterSettings(**cfg))


@dataclass
class StreamRun:
    """What a stream filter sent, per feed call, and how it ended."""

    sent: list[str] = field(default_factory=list)
    verdicts: list[FilterVerdict] = field(default_factory=list)
    blocked: bool = False

    @property
    def text(self) -> str:
        return "".join(self.sent)


def run_stream(flt: SafetyStreamFilter, chunks: list[str]) -> StreamRun:
    """Feed ``chunks`` then finish, like the host does (stop feeding after a block)."""
    run = StreamRun()
    for chunk in chunks:
        r = flt.feed(chunk)
        run.sent.append(r.text)
        run.verdicts.extend(r.verdicts)
        if r.blocked:
            run.blocked = True
            return run
    r = flt.finish()
    run.sent.append(r.text)
    run.verdicts.extend(r.verdicts)
    run.blocked = r.blocked
    return run


def stream_of(b: PolicyBook, tenant: str | None = None) -> SafetyStreamFilter:
    """A stream filter for the default policy (or a tenant's)."""
    from servehall import Principal

    return SafetyStreamFilter(b.for_principal(Principal(id="p", tenant=tenant)).output)


def chunked(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of ``size`` characters."""
    return [text[i : i + size] for i in range(0, len(text), size)]


class RepeatDetector:
    """A tiny contributed :class:`~servehall_safety_filter.Detector` (for tests/docs):
    finds runs of ``options["times"]`` or more ``options["char"]``."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.char = str(options.get("char", "!"))
        self.times = int(options.get("times", 3))
        self.max_match_chars = 16

    def find(self, text: str, start: int, stop: int) -> list[tuple[int, int]]:
        """Runs of the character starting in ``[start, stop)`` (cut at 16 characters)."""
        out = []
        i = start
        while i < stop:
            if text[i] == self.char and (i == 0 or text[i - 1] != self.char):
                j = i
                while j < len(text) and text[j] == self.char and j - i < 16:
                    j += 1
                if j - i >= self.times:
                    out.append((i, j))
                i = j
            else:
                i += 1
        return out
