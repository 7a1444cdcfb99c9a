"""Built-in detectors: Luhn, IBAN mod-97, phone numbers, national IDs, e-mail."""

from __future__ import annotations

import pytest

from servehall import PromptParts
from servehall_safety_filter.detectors import iban_ok, luhn_ok
from servehall_safety_filter.input_filter import SafetyInputFilter
from servehall_safety_filter.testing import book


def redact(detector: str, text: str, **extra: object) -> str:
    b = book(rules=[{"name": detector, "detector": detector, "action": "redact", **extra}])
    parts = PromptParts(texts=[text], endpoint="/v1/completions", model="m")
    SafetyInputFilter(b).check(parts)
    return parts.texts[0]


@pytest.mark.parametrize(
    ("digits", "ok"),
    [
        ("4111111111111111", True),
        ("4111111111111112", False),
        ("5500005555555559", True),
        ("378282246310005", True),  # Amex, 15 digits
        ("79927398713", True),
        ("79927398710", False),
    ],
)
def test_luhn(digits: str, ok: bool) -> None:
    assert luhn_ok(digits) is ok


@pytest.mark.parametrize(
    ("iban", "ok"),
    [
        ("DE89 3704 0044 0532 0130 00", True),
        ("GB82 WEST 1234 5698 7654 32", True),
        ("gb82west12345698765432", True),
        ("FR14 2004 1010 0505 0001 3M02 606", True),
        ("DE89 3704 0044 0532 0130 01", False),
        ("GB82 WEST 1234 5698 7654 33", False),
        ("XX00", False),
        ("GB82 WEST 1234 5698 7654 32 WORD", False),  # mod-97 passes, length does not
    ],
)
def test_iban_mod97(iban: str, ok: bool) -> None:
    assert iban_ok(iban) is ok


def test_cards_are_luhn_checked_and_shortened_to_a_group() -> None:
    assert redact("payment_card", "pay 4111 1111 1111 1111 now") == "pay [CARD] now"
    assert redact("payment_card", "pay 4111-1111-1111-1111 123") == "pay [CARD] 123"
    assert redact("payment_card", "pay 4111111111111111.") == "pay [CARD]."
    # fails Luhn: left alone
    assert redact("payment_card", "order 4111 1111 1111 1112") == "order 4111 1111 1111 1112"
    assert redact("payment_card", "id 1234567890123") == "id 1234567890123"


def test_iban_detector() -> None:
    assert redact("iban", "to DE89 3704 0044 0532 0130 00 please") == "to [IBAN] please"
    assert redact("iban", "to gb82west12345698765432.") == "to [IBAN]."
    assert redact("iban", "GB82 WEST 1234 5698 7654 32 word") == "[IBAN] word"
    assert redact("iban", "to DE89 3704 0044 0532 0130 01 please") == (
        "to DE89 3704 0044 0532 0130 01 please"
    )


def test_phone_detector() -> None:
    assert redact("phone", "call +1 (555) 123-4567 today") == "call [PHONE] today"
    assert redact("phone", "call 030 1234-5678.") == "call [PHONE]."
    assert redact("phone", "or 555.123.4567") == "or [PHONE]"
    # plain numbers are not phones
    assert redact("phone", "in 2024 1000 people came") == "in 2024 1000 people came"
    assert redact("phone", "pi is 3.14159") == "pi is 3.14159"


def test_email_detector_and_fullwidth_at() -> None:
    assert redact("email", "mail Bob.Smith@Example.COM.") == "mail [EMAIL]."
    assert redact("email", "mail bob\uff20example\uff0ecom now") == "mail [EMAIL] now"
    assert redact("email", "not an email: a@b or @home") == "not an email: a@b or @home"


def test_national_id_presets_and_patterns() -> None:
    out = redact("national_id", "ssn 123-45-6789 or 000-12-3456", presets=["us_ssn"])
    assert out == "ssn [NATIONAL_ID] or 000-12-3456"
    out = redact("national_id", "nino AB 12 34 56 C", presets=["uk_nino"])
    assert out == "nino [NATIONAL_ID]"
    out = redact(
        "national_id",
        "id X-1234567 here",
        patterns=[r"x-\d{7}"],
        replacement="<ID>",
    )
    assert out == "id <ID> here"
