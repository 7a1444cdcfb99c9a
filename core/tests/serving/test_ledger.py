"""``servehall.serving.ledger.TokenLedger``: completion tokens count as their text is
released to the client, however the engine's tokens were grouped into deltas."""

from __future__ import annotations

from servehall.serving.ledger import TokenLedger


def test_nothing_counts_before_its_text_is_released() -> None:
    ledger = TokenLedger()
    ledger.produce(1, "Hel")
    ledger.produce(1, "lo")
    assert ledger.produced_tokens == 2 and ledger.text_end == 5
    assert ledger.counted == 0
    assert ledger.release(2) == 0  # "He": the first token's text ends at 3
    assert ledger.release(3) == 1
    assert ledger.release(5) == 2


def test_release_never_goes_back_or_past_the_produced_text() -> None:
    ledger = TokenLedger()
    ledger.produce(1, "abc")
    assert ledger.release(10) == 1
    assert ledger.released == 3
    assert ledger.release(1) == 1
    assert ledger.released == 3


def test_a_token_with_empty_text_ends_with_the_next_piece() -> None:
    ledger = TokenLedger()
    ledger.produce(1, "")  # half of a multi-byte character
    ledger.produce(1, "é")
    ledger.produce(1, "x")
    assert ledger.release(1) == 2
    assert ledger.release(2) == 3


def test_a_merged_delta_counts_as_one_group() -> None:
    """Three tokens merged into one delta count when their text is released, as the
    same three tokens streamed one by one do at the same point."""
    merged, single = TokenLedger(), TokenLedger()
    merged.produce(3, "abc")
    for ch in "abc":
        single.produce(1, ch)
    assert merged.release(2) == 0 and single.release(2) == 2
    assert merged.release(3) == single.release(3) == 3


def test_release_all_counts_every_produced_token_even_without_text() -> None:
    ledger = TokenLedger()
    ledger.produce(2, "ab")
    ledger.produce(1, "")  # a special token at the end, no text
    assert ledger.release(1) == 0
    assert ledger.release_all() == 3 == ledger.produced_tokens


def test_a_blocked_choice_counts_only_what_was_sent() -> None:
    ledger = TokenLedger()
    for piece in ("one ", "two ", "three"):
        ledger.produce(1, piece)
    assert ledger.release(len("one two ")) == 2
    assert ledger.counted == 2 and ledger.produced_tokens == 3
