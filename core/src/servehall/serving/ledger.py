"""Which generated tokens the client was given: a choice's completion tokens, counted as
their text is released.

A choice's usage (``usage.completion_tokens``), its record and the rate limits charge
the tokens of the text the client received, not every token the engine produced: when
an output filter blocks (or the choice ends early in any other way) the tokens whose
text was never sent are not counted, however the engine's steps were merged into deltas
— so identical greedy requests count the same streamed and not.

:class:`TokenLedger` keeps the produced tokens with the end of their text in the
choice's text (characters of the detokenized output, before stop strings and output
filters). A token whose piece is empty (half of a multi-byte character, a special token)
ends where the next non-empty piece ends: its text is that piece's. Releasing the text up
to character ``k`` counts the tokens whose text ends at or before ``k``; a stop string
or the engine's end releases everything produced (the tokens of a stop string count, as
upstream).
"""

from __future__ import annotations

from collections import deque


class TokenLedger:
    """Produced tokens and the end of their text; :attr:`counted` = tokens released.

    Attributes:
        counted: tokens whose text was released (the choice's ``completion_tokens``).
        produced_tokens: every token produced so far.
        text_end: characters of text produced so far.
    """

    __slots__ = ("_pending", "_unplaced", "counted", "produced_tokens", "released", "text_end")

    def __init__(self) -> None:
        self._pending: deque[tuple[int, int]] = deque()  # (tokens, end of their text)
        self._unplaced = 0  # tokens whose text is still empty: they end with the next piece
        self.counted = 0
        self.produced_tokens = 0
        self.released = 0
        self.text_end = 0

    def produce(self, tokens: int, text: str) -> None:
        """``tokens`` (a count, >= 0) produced ``text`` (possibly empty) together."""
        self.produced_tokens += tokens
        self._unplaced += tokens
        if text:
            self.text_end += len(text)
            self._pending.append((self._unplaced, self.text_end))
            self._unplaced = 0

    def release(self, upto: int) -> int:
        """The text up to character ``upto`` (absolute, in the produced text) was given
        to the client: count the tokens whose text ends there or before.

        Returns:
            :attr:`counted` afterwards.
        """
        if upto > self.released:
            self.released = min(upto, self.text_end)
        pending = self._pending
        while pending and pending[0][1] <= self.released:
            self.counted += pending.popleft()[0]
        return self.counted

    def release_all(self) -> int:
        """Everything produced counts (the engine finished, a stop string matched).

        Returns:
            :attr:`counted` afterwards (= :attr:`produced_tokens`).
        """
        self.release(self.text_end)
        self.counted += self._unplaced
        self._unplaced = 0
        return self.counted
