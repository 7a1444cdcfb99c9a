"""Key format, hashing with the pepper, and constant-time verification."""

from __future__ import annotations

import hashlib
import hmac

from servehall_auth.keys import (
    format_key,
    hash_key,
    new_key_id,
    new_secret,
    parse_key,
    public_id,
    verify_key,
)

PEPPER = "pepper-0123456789abcdef"


def test_new_keys_parse_and_are_distinct() -> None:
    keys = {format_key(new_key_id(), new_secret()) for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        parsed = parse_key(key)
        assert parsed is not None
        assert key.startswith(parsed.public_id + "-")
        assert len(key) == len("sh-") + 10 + 1 + 43


def test_secret_has_256_bits_of_alphabet() -> None:
    s = new_secret()
    assert (
        len(s) == 43
        and "-" not in s
        and set(s) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
    )


def test_parse_rejects_malformed() -> None:
    good = format_key("abcdefgh23", "A" * 43)
    assert parse_key(good) is not None
    for bad in (
        good[:-1],
        good + "A",
        good.replace("sh-", "sk-"),
        "sh-ABCDEFGH23-" + "A" * 43,  # upper-case id
        "sh-abcdefgh23" + "A" * 44,
        "sh-abcdefgh23-" + "A" * 42 + "-",
        "",
    ):
        assert parse_key(bad) is None, bad


def test_hash_is_peppered_hmac_sha256() -> None:
    key = format_key(new_key_id(), new_secret())
    h = hash_key(key, PEPPER)
    assert h == hmac.new(PEPPER.encode(), key.encode(), hashlib.sha256).hexdigest()
    assert h != hashlib.sha256(key.encode()).hexdigest()
    assert hash_key(key, PEPPER + "x") != h
    assert key not in h


def test_verify() -> None:
    key = format_key(new_key_id(), new_secret())
    h = hash_key(key, PEPPER)
    assert verify_key(key, PEPPER, h)
    assert not verify_key(key + "x", PEPPER, h)
    assert not verify_key(key, "another-pepper-123456", h)
    assert not verify_key(key, PEPPER, None)


def test_public_id() -> None:
    assert public_id("abcdefgh23") == "sh-abcdefgh23"
