"""Content-filter interfaces used by the request path (steps 4 and 8 of DESIGN.md).

Input filters see the whole prompt before tokenization; output filters are per-request
stream filters fed detokenized text as it is produced. Plugins return these objects from
``servehall_input_filters`` / ``servehall_output_filters``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from servehall.admission.principal import Principal

FilterAction = Literal["allow", "redact", "block", "flag"]


@dataclass(frozen=True, slots=True)
class FilterVerdict:
    """One filter decision.

    Attributes:
        action: ``allow`` (nothing to do), ``redact`` (text was rewritten), ``block``
            (refuse: 400 ``content_filter`` for input; ``finish_reason: content_filter``
            for output), ``flag`` (allow, but record).
        rule: the public rule name (never the matched text).
        stage: ``"input"`` or ``"output"``.
        count: how many matches the rule had.
        monitor: True when the rule runs in monitor mode (recorded, not enforced).
    """

    action: FilterAction
    rule: str = ""
    stage: Literal["input", "output"] = "input"
    count: int = 1
    monitor: bool = False


@dataclass(slots=True)
class PromptParts:
    """The texts of a prompt that input filters may read and rewrite in place.

    ``texts`` holds every user-visible text part in order (each message's content, each
    text content part, or the completion prompt). Filters replace entries to redact.
    """

    texts: list[str]
    endpoint: str
    model: str
    principal: Principal | None = None


@runtime_checkable
class InputFilter(Protocol):
    """Filters a whole prompt before tokenization."""

    name: str

    def check(self, prompt: PromptParts) -> list[FilterVerdict]:
        """Inspect (and for ``redact``, rewrite ``prompt.texts``); return the verdicts.

        A verdict with ``action == "block"`` and ``monitor == False`` makes the host
        refuse the request with 400 ``content_filter`` naming ``rule``.
        """
        ...


@dataclass(frozen=True, slots=True)
class StreamFilterResult:
    """What an output stream filter lets through.

    Attributes:
        text: text safe to send now (possibly redacted); may be empty while the filter
            holds back a window that could still become a match.
        verdicts: decisions made on this feed.
        blocked: True ends the stream with ``finish_reason: "content_filter"`` after
            ``text`` is sent; the engine request is aborted.
        consumed: how many characters of the filter's input (counted from the start of
            the stream) the text let through so far, this result's included, stands
            for; on a block, where the input was cut. The host counts the completion
            tokens of that input only (usage, records and rate limits charge what the
            client received). None: not said; the host then takes the text let through
            as a copy of the input after the last stated point (exact for a filter that
            never rewrites text).
    """

    text: str
    verdicts: tuple[FilterVerdict, ...] = ()
    blocked: bool = False
    consumed: int | None = None


@runtime_checkable
class OutputStreamFilter(Protocol):
    """A per-request filter over one choice's detokenized output stream.

    The host calls :meth:`feed` with each new piece of text and :meth:`finish` once at
    the end; text returned by one call is sent before text of the next. Filters chain:
    the output of one is the input of the next.
    """

    def feed(self, text: str) -> StreamFilterResult:
        """Take new text; return what may be sent now."""
        ...

    def finish(self) -> StreamFilterResult:
        """The stream ended: release (or block) whatever is held back."""
        ...


@dataclass(slots=True)
class FilterRecord:
    """Verdicts gathered during a request, for the request log."""

    verdicts: list[FilterVerdict] = field(default_factory=list)
