"""Header forms (case C16 at the unit level)."""

from __future__ import annotations

import pytest

from servehall import AuthenticationError
from servehall_auth.headers import Credential, extract_credential, parse_authorization

KEY = "sh-abcdefgh23-" + "A" * 43


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_case_insensitive(scheme: str) -> None:
    assert parse_authorization(f"{scheme} {KEY}") == KEY


@pytest.mark.parametrize(
    "value",
    [
        f"Bearer  {KEY}",  # two spaces
        "Bearer",
        "Bearer ",
        f"Basic {KEY}",
        "Basic dXNlcjpwYXNz",
        f"Token {KEY}",
        f"Bearer {KEY} extra",
        f"Bearer {KEY} ",
        f"Bearer\t{KEY}",
        f"Bearer {KEY},x",
        "",
        "Bearer " + "a" * 9000,
    ],
)
def test_malformed_authorization(value: str) -> None:
    with pytest.raises(AuthenticationError) as ei:
        parse_authorization(value)
    assert ei.value.status == 401
    assert ei.value.headers["WWW-Authenticate"] == "Bearer"
    assert KEY not in ei.value.message


def test_x_api_key() -> None:
    cred = extract_credential([], [KEY])
    assert cred == Credential(KEY, "x-api-key")
    assert KEY not in repr(cred)


def test_no_credential() -> None:
    assert extract_credential([], []) is None


def test_precedence_authorization_default() -> None:
    other = "sh-zzzzzzzz22-" + "B" * 43
    cred = extract_credential([f"Bearer {KEY}"], [other])
    assert cred is not None and cred.token == KEY and cred.source == "authorization"
    # the chosen header decides alone: a bad Authorization is a 401 despite a good x-api-key
    with pytest.raises(AuthenticationError):
        extract_credential(["Basic abc"], [KEY])


def test_precedence_x_api_key() -> None:
    other = "sh-zzzzzzzz22-" + "B" * 43
    cred = extract_credential([f"Bearer {KEY}"], [other], precedence="x-api-key")
    assert cred is not None and cred.token == other and cred.source == "x-api-key"


def test_repeated_headers_rejected() -> None:
    with pytest.raises(AuthenticationError):
        extract_credential([f"Bearer {KEY}", f"Bearer {KEY}"], [])
    with pytest.raises(AuthenticationError):
        extract_credential([], [KEY, KEY])


@pytest.mark.parametrize("value", ["", " ", "a b", "k\u00e9y"])
def test_bad_x_api_key(value: str) -> None:
    with pytest.raises(AuthenticationError):
        extract_credential([], [value])
