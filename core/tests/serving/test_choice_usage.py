"""Usage is what the client received: :class:`~servehall.serving.ledger.TokenLedger` and
:class:`~servehall.serving.choice.ChoiceStream`'s ``completion_tokens`` on an output
filter block, a stop string, a redacting filter before a blocking one, and an early
end — the same count however the engine merged its steps into deltas."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from servehall.admission.filters import StreamFilterResult
from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.serving.choice import ChoiceStream
from servehall.serving.ledger import TokenLedger
from servehall.text.detokenize import IncrementalDetokenizer
from servehall.text.stops import StopMatcher

#: one piece of text per token id; "é" split over two ids (the first decodes to nothing)
VOCAB: list[bytes] = [
    b"Once",
    b" upon",
    b" a",
    b" time",
    b" a",
    b" BA",
    b"D",
    b" cat",
    "é".encode()[:1],
    "é".encode()[1:],
    b" sat",
    b".",
    b"",  # an EOS-like id: no text
]
STORY = [0, 1, 2, 3, 8, 9, 4, 7, 10, 5, 6, 7, 10, 11, 12]
TEXT = "".join(VOCAB[i].decode("utf-8", "ignore") for i in STORY if i not in (8, 9))


def _story_text() -> str:
    return b"".join(VOCAB[i] for i in STORY).decode()


class ListEngine:
    """Yields ``STORY`` in the given groups (a worker's merged steps)."""

    backend = "list"

    def __init__(self, groups: Sequence[Sequence[int]]) -> None:
        self.groups = [tuple(g) for g in groups]
        self.aborted: list[str] = []

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        async def run() -> AsyncIterator[TokenDelta]:
            for i, g in enumerate(self.groups):
                yield TokenDelta(g, "length" if i == len(self.groups) - 1 else None)

        return run()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@dataclass
class WordBlocker:
    """Blocks at the first ``word``; holds back ``len(word) - 1`` characters. States
    ``consumed`` only when ``states`` (else the host assumes a one-to-one copy)."""

    word: str = "BAD"
    states: bool = True
    _buf: str = ""
    _base: int = 0

    def _result(self, text: str, blocked: bool) -> StreamFilterResult:
        self._base += len(text)
        return StreamFilterResult(text, (), blocked, self._base if self.states else None)

    def feed(self, text: str) -> StreamFilterResult:
        self._buf += text
        at = self._buf.find(self.word)
        if at >= 0:
            out, self._buf = self._buf[:at], ""
            return self._result(out, True)
        keep = len(self.word) - 1
        out, self._buf = self._buf[:-keep] if keep else self._buf, self._buf[-keep:]
        return self._result(out, False)

    def finish(self) -> StreamFilterResult:
        out, self._buf = self._buf, ""
        return self._result(out, False)


@dataclass
class Redactor:
    """Replaces each ``word`` by ``[X]`` (holding back a possible partial word) and
    states ``consumed``."""

    word: str = "time"
    _buf: str = ""
    _consumed: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)

    def feed(self, text: str) -> StreamFilterResult:
        self._buf += text
        out: list[str] = []
        while True:
            at = self._buf.find(self.word)
            if at < 0:
                break
            out.append(self._buf[:at] + "[X]")
            self._consumed += at + len(self.word)
            self._buf = self._buf[at + len(self.word) :]
        keep = len(self.word) - 1
        safe = max(len(self._buf) - keep, 0)
        out.append(self._buf[:safe])
        self._consumed += safe
        self._buf = self._buf[safe:]
        return StreamFilterResult("".join(out), consumed=self._consumed)

    def finish(self) -> StreamFilterResult:
        out, self._buf = self._buf, ""
        self._consumed += len(out)
        return StreamFilterResult(out, consumed=self._consumed)


def _groupings(n: int, count: int = 12) -> list[list[list[int]]]:
    """Splits of STORY into deltas: one per token, all in one, and random ones."""
    rng = random.Random(7)
    out = [[[t] for t in STORY], [list(STORY)]]
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, n), rng.randint(1, n - 2)))
        out.append([STORY[a:b] for a, b in itertools.pairwise([0, *cuts, n])])
    return out


def _run(groups: list[list[int]], **kw: object) -> ChoiceStream:
    choice = ChoiceStream(
        engine=ListEngine(groups),  # type: ignore[arg-type]
        index=0,
        request_id="r-0",
        prompt_ids=[1],
        params=SamplingParams(max_tokens=64),
        detok=IncrementalDetokenizer(VOCAB),
        **kw,  # type: ignore[arg-type]
    )

    async def drain() -> None:
        async for _ in choice.events():
            pass

    asyncio.run(drain())
    return choice


def _tokens_before(cut: int) -> int:
    """Tokens of STORY whose text ends at or before character ``cut`` (an empty piece
    belongs to the next non-empty one)."""
    ledger = TokenLedger()
    detok = IncrementalDetokenizer(VOCAB)
    for t in STORY:
        ledger.produce(1, detok.feed([t]))
    return ledger.release(cut)


def test_ledger_counts_tokens_as_their_text_is_released() -> None:
    ledger = TokenLedger()
    ledger.produce(1, "ab")
    ledger.produce(1, "")  # half a character: ends with the next piece
    ledger.produce(2, "cd")
    assert ledger.release(1) == 0  # "ab" not all released
    assert ledger.release(2) == 1
    assert ledger.release(3) == 1
    assert ledger.release(4) == 4
    ledger.produce(1, "")  # EOS: no text; counted only when everything is
    assert ledger.release(10) == 4 and ledger.released == 4
    assert ledger.release_all() == 5 == ledger.produced_tokens


def test_without_early_end_every_token_counts() -> None:
    for groups in _groupings(len(STORY), 4):
        choice = _run(groups)
        assert choice.text == _story_text()
        assert choice.completion_tokens == len(STORY)
        choice = _run(groups, filters=[WordBlocker("nowhere")])
        assert choice.text == _story_text() and choice.completion_tokens == len(STORY)


@pytest.mark.parametrize("states", [True, False], ids=["stated", "copy"])
def test_a_block_counts_the_tokens_before_the_cut_whatever_the_deltas(states: bool) -> None:
    cut = _story_text().index("BAD")
    expected = _tokens_before(cut)
    assert 0 < expected < len(STORY) - 3
    for groups in _groupings(len(STORY)):
        choice = _run(groups, filters=[WordBlocker(states=states)])
        assert choice.finish_reason == "content_filter"
        assert choice.text == _story_text()[:cut]
        assert choice.completion_tokens == expected, groups


def test_a_stop_string_counts_through_the_token_completing_it() -> None:
    text = _story_text()
    # " cat" first completes with token 7 (index 7 of STORY)
    for groups in _groupings(len(STORY)):
        choice = _run(groups, stops=StopMatcher([" cat"]))
        assert choice.text == text[: text.index(" cat")] and choice.finish_reason == "stop"
        assert choice.completion_tokens == STORY.index(7) + 1
        # a block after the stop's position never happens; one before it wins
        choice = _run(groups, stops=StopMatcher([" sat"]), filters=[WordBlocker("time")])
        assert choice.finish_reason == "content_filter"
        assert choice.completion_tokens == _tokens_before(text.index("time"))


def test_a_redacting_filter_before_the_blocker_maps_the_cut_back() -> None:
    text = _story_text()
    cut = text.index("BAD")
    for groups in _groupings(len(STORY)):
        for states in (True, False):
            choice = _run(groups, filters=[Redactor(), WordBlocker(states=states)])
            assert choice.finish_reason == "content_filter"
            assert choice.text == text[:cut].replace("time", "[X]")
            assert choice.completion_tokens == _tokens_before(cut), (groups, states)


def test_a_client_gone_mid_stream_counts_what_it_was_given() -> None:
    choice = ChoiceStream(
        engine=ListEngine([[t] for t in STORY]),  # type: ignore[arg-type]
        index=0,
        request_id="r-0",
        prompt_ids=[1],
        params=SamplingParams(max_tokens=64),
        detok=IncrementalDetokenizer(VOCAB),
        filters=[WordBlocker("zzz")],  # holds back two characters
    )

    async def first_events() -> str:
        got = ""
        events = choice.events()
        async for ev in events:
            got += ev.text
            if len(got) >= 10:
                break
        await events.aclose()
        return got

    got = asyncio.run(first_events())
    assert choice.completion_tokens == _tokens_before(len(got)) < len(STORY)
