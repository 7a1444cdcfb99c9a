"""One choice of a request: engine stream → detokenize → stop strings → output filters
→ tool calls.

:class:`ChoiceStream` drives one engine request and yields :class:`ChoiceEvent` text
deltas; the last event of a choice carries the OpenAI ``finish_reason``. With tools, a
:class:`~servehall.tools.calls.ToolCallStream` reads the filtered text (output filters
see tool-call text like any other) and splits it into content and tool-call pieces;
``finish_reason`` is then ``tool_calls`` when the model called one and stopped by itself.
Whenever the choice ends before the engine finished (stop string, output filter block,
cancellation because the client went away) the engine request is aborted, freeing its KV
cache.

``completion_tokens`` (usage, records, rate limits) counts the tokens of the text the
client was given (:class:`~servehall.serving.ledger.TokenLedger`): with stop strings or
output filters each delta is detokenized token by token, so each token's text is known
whatever the engine merged into one delta; tokens count as their text is released, on an
output filter's block only those whose text lies before the cut (the filters' stated
``consumed`` positions, mapped back through the chain), at the engine's end or a stop
string all of them. Identical greedy requests therefore count the same streamed and not.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from servehall.admission.filters import FilterVerdict, OutputStreamFilter, StreamFilterResult
from servehall.engines.contract import Engine, SamplingParams, TokenDelta
from servehall.engines.kit import DeltaStream
from servehall.errors import (
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    ServehallError,
)
from servehall.serving.ledger import TokenLedger
from servehall.text.detokenize import IncrementalDetokenizer
from servehall.text.stops import StopMatcher
from servehall.tools.calls import ToolCall, ToolCallDelta, ToolCallStream, assemble, merge_deltas

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def engine_failure(delta: TokenDelta, param: str | None = None) -> ServehallError:
    """The client-facing error of an ``error`` delta, by its ``code``: ``invalid_request``
    → 400 (``param``: the request field the engine refused, when known),
    ``engine_unavailable`` → 503 + ``Retry-After: 1``, else 500 ``engine_error``."""
    message = delta.error or "The engine failed this request."
    if delta.code == "invalid_request":
        return InvalidRequestError(message, param=param)
    if delta.code == "engine_unavailable":
        return EngineUnavailableError(message, headers={"Retry-After": "1"})
    return EngineError(message)


@dataclass(slots=True)
class ChoiceEvent:
    """Text (content) for choice ``index`` and, with tools, tool-call pieces;
    ``finish_reason`` is set on the choice's last event."""

    index: int
    text: str
    finish_reason: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


@dataclass(slots=True)
class ChoiceStream:
    """State and driver of one choice (see the module docstring)."""

    engine: Engine
    index: int
    request_id: str
    prompt_ids: Sequence[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    stops: StopMatcher | None = None
    filters: list[OutputStreamFilter] = field(default_factory=list)
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    inter_token_s: list[float] = field(default_factory=list)
    """Per-token gaps after the first token (s): a delta of n tokens after a gap g adds n
    entries g/n (``servehall_inter_token_latency_seconds``)."""
    finish_reason: str | None = None
    text_parts: list[str] = field(default_factory=list)
    verdicts: list[FilterVerdict] = field(default_factory=list)
    refusal_param: str | None = None
    """The request field an engine's ``invalid_request`` refusal names (the constraint's)."""
    #: with tools: reads the output into content and tool calls (None: all is content)
    tools: ToolCallStream | None = None
    content_parts: list[str] = field(default_factory=list)
    call_deltas: list[ToolCallDelta] = field(default_factory=list)
    ledger: TokenLedger = field(default_factory=TokenLedger)
    """The produced tokens and the text they made; ``completion_tokens`` is its count."""
    #: per output filter: cumulative (output chars, input chars stated) after each result
    _outs: list[list[int]] = field(default_factory=list)
    _ins: list[list[int]] = field(default_factory=list)
    _stopped_chars: int = 0
    """Characters of text past the stop strings so far (the output filters' input)."""

    def _filter(self, text: str, final: bool) -> tuple[str, bool, int]:
        """``text`` through the output filters: (text to send, blocked, the position in
        the filters' input text that what was sent so far stands for)."""
        if not self._outs:
            self._outs = [[] for _ in self.filters]
            self._ins = [[] for _ in self.filters]
        out = text
        for i, f in enumerate(self.filters):
            pieces = []
            if out:
                r = f.feed(out)
                pieces.append(r.text)
                self.verdicts.extend(r.verdicts)
                self._mark(i, r)
                if r.blocked:
                    return "".join(pieces), True, self._input_position(i)
            if final:
                r = f.finish()
                pieces.append(r.text)
                self.verdicts.extend(r.verdicts)
                self._mark(i, r)
                if r.blocked:
                    return "".join(pieces), True, self._input_position(i)
            out = "".join(pieces)
        return out, False, self._input_position(len(self.filters) - 1)

    def _mark(self, i: int, r: StreamFilterResult) -> None:
        """Note filter ``i``'s result: its output so far and the input it stands for."""
        outs, ins = self._outs[i], self._ins[i]
        out_end = (outs[-1] if outs else 0) + len(r.text)
        last_in = ins[-1] if ins else 0
        in_end = r.consumed if r.consumed is not None else last_in + len(r.text)
        if out_end != (outs[-1] if outs else 0) or in_end != last_in:
            outs.append(out_end)
            ins.append(max(in_end, last_in))

    def _input_position(self, i: int) -> int:
        """The position in the filter chain's input that filter ``i``'s released text
        stands for: its stated input position, mapped back through the filters before it
        (exact at the ends of their results and inside a result copied one to one; inside
        a rewritten result, the text after the position is taken as copied)."""
        pos = self._ins[i][-1] if self._ins[i] else 0
        for j in range(i - 1, -1, -1):
            outs, ins = self._outs[j], self._ins[j]
            k = bisect.bisect_left(outs, pos)
            if k == len(outs):
                pos = ins[-1] if ins else 0
                continue
            o0, i0 = (outs[k - 1], ins[k - 1]) if k else (0, 0)
            if outs[k] == pos:
                pos = ins[k]
            elif outs[k] - o0 == ins[k] - i0:
                pos = i0 + (pos - o0)
            else:  # a rewritten piece: taken as rewritten before the position
                pos = max(i0, ins[k] - (outs[k] - pos))
        return pos

    def _text(self, token_ids: Sequence[int], last: bool) -> tuple[str, bool]:
        """The text ``token_ids`` add (``last``: the engine's final delta), after stop
        strings; ``(text, stopped)``. Notes the tokens in the ledger: with stop strings or
        output filters, a delta of several tokens (a worker's merged steps, a slow
        reader's backlog) is detokenized token by token, so that each token's text is
        known — a stop string counts the tokens up to the one completing it, a block the
        tokens before the cut, as if they had come one per delta."""
        stops = self.stops
        fine = stops is not None or bool(self.filters)
        groups = [token_ids] if not fine or len(token_ids) <= 1 else [(t,) for t in token_ids]
        parts: list[str] = []
        stopped = False
        ledger = self.ledger
        for group in groups:
            piece = self.detok.feed(group) if group else ""
            ledger.produce(len(group), piece)
            if stops is not None:
                piece, stopped = stops.feed(piece)
            parts.append(piece)
            if stopped:  # later tokens of the group are not produced: never counted
                return self._passed("".join(parts)), True
        if last:
            tail = self.detok.finish()
            ledger.produce(0, tail)
            if stops is not None:
                tail, stopped = stops.feed(tail)
                if not stopped:
                    tail += stops.flush()
            parts.append(tail)
        return self._passed("".join(parts)), stopped

    def _passed(self, text: str) -> str:
        self._stopped_chars += len(text)
        return text

    async def events(self) -> AsyncGenerator[ChoiceEvent, None]:
        """Run the engine request and yield text deltas; aborts it if cut short."""
        stream: Any = self.engine.add_request(self.request_id, self.prompt_ids, self.params)
        coalesce = stream.coalesce if isinstance(stream, DeltaStream) else None
        engine_done = False
        try:
            async for delta in stream:
                if coalesce is not None:  # take the backlog of a slow consumer at once
                    delta = coalesce(delta)
                if delta.token_ids:
                    now = time.monotonic()
                    if self.last_token_at is None:
                        self.first_token_at = now
                    else:
                        n = len(delta.token_ids)
                        self.inter_token_s.extend([(now - self.last_token_at) / n] * n)
                    self.last_token_at = now
                finish: str | None = None
                if delta.finish_reason is not None:
                    engine_done = True
                    if delta.finish_reason == "error":
                        raise engine_failure(delta, self.refusal_param)
                text, stopped = self._text(delta.token_ids, delta.finish_reason is not None)
                if stopped:
                    finish = "stop"
                if finish is None and delta.finish_reason is not None:
                    finish = _FINISH.get(delta.finish_reason, "stop")
                released = self._stopped_chars
                if self.filters:
                    text, blocked, released = self._filter(text, final=finish is not None)
                    if blocked:
                        finish = "content_filter"
                if finish is not None and finish != "content_filter":
                    # the engine's end, or a stop string (its tokens count, as upstream)
                    self.ledger.release_all()
                else:
                    self.ledger.release(released)
                self.completion_tokens = self.ledger.counted
                if text:
                    self.text_parts.append(text)
                calls: list[ToolCallDelta] | None = None
                if self.tools is not None:
                    text, calls, finish = self._tool_calls(text, finish)
                if text or calls or finish is not None:
                    self.finish_reason = finish
                    yield ChoiceEvent(self.index, text, finish, calls)
                if finish is not None:
                    return
        finally:
            if not engine_done:
                # at once, and to the end even when this task is being cancelled (client
                # gone, shutdown): an engine in a worker process awaits its IPC here
                await asyncio.shield(self.engine.abort(self.request_id))
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _tool_calls(
        self, text: str, finish: str | None
    ) -> tuple[str, list[ToolCallDelta] | None, str | None]:
        """``text`` through the tool-call stream: (content, call pieces, finish_reason)."""
        tools = self.tools
        assert tools is not None
        out = tools.feed(text) if text else None
        content = out.content if out else ""
        calls = out.calls if out else []
        if finish is not None:
            tail = tools.finish()
            content += tail.content
            calls += tail.calls
        if content:
            self.content_parts.append(content)
        if calls:
            calls = merge_deltas(calls)
            self.call_deltas.extend(calls)
        if finish == "stop" and self.call_deltas:
            finish = "tool_calls"
        return content, calls or None, finish

    @property
    def text(self) -> str:
        """The whole output text so far (tool-call text included): what records store."""
        return "".join(self.text_parts)

    @property
    def content(self) -> str | None:
        """The message content: the text outside tool calls (without tools: all of it);
        None when the model only called tools."""
        if self.tools is None:
            return self.text
        content = "".join(self.content_parts)
        return None if not content and self.call_deltas else content

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The calls the model made (empty without tools)."""
        return assemble(self.call_deltas) if self.call_deltas else []
