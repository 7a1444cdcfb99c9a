"""Credentials are removed from log records at every level, including library DEBUG logs."""

from __future__ import annotations

import io
import logging

import pytest

from servehall_auth.redaction import install, redact

KEY = "sh-abcdefgh23-" + "Q" * 43
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    "text",
    [
        f"Decoded (b'authorization', b'Bearer {KEY}'), total consumed 54 bytes",
        f"Decoded (b'x-api-key', b'{KEY}')",
        f"header Authorization: bearer {JWT}",
        f"token={JWT} and again {KEY[:-3]}",
        "Authorization: Bearer dXNlcjpwYXNzd29yZA==",
        f"Authorization: Basic {KEY}",
    ],
)
def test_redact_patterns(text: str) -> None:
    out = redact(text)
    for secret in (KEY, KEY[:-3], "Q" * 8, JWT, "c2lnbmF0dXJl", "dXNlcjpwYXNzd29yZA"):
        assert secret not in out
    if "sh-" in text:
        assert "sh-abcdefgh23-***" in out  # the public id stays


def test_redact_literals_and_plain_text() -> None:
    assert redact("pepper is p3pp3r-value", ["p3pp3r-value"]) == "pepper is ***"
    for plain in (
        "GET /v1/models 200",
        "token budget 256, basic setup done",
        "prefill of 12 tokens; decode step",
    ):
        assert redact(plain) == plain


def test_install_filters_root_handlers() -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        undo = install(["secret-pepper-123456"])
        try:
            logging.getLogger("some.lib").debug("got %s with %s", KEY, "secret-pepper-123456")
            logging.getLogger("h2.lib").debug("Decoded (b'authorization', b'Bearer %s')", KEY)
            try:
                raise ValueError(f"bad {KEY}")
            except ValueError:
                logging.getLogger("some.lib").exception("failed")
        finally:
            undo()
        text = buf.getvalue()
        assert "got sh-abcdefgh23-*** with ***" in text
        assert "Q" * 20 not in text and "secret-pepper-123456" not in text
        assert "Decoded (b'authorization', b'Bearer sh-abcdefgh23-***')" in text
        assert not any(f for f in handler.filters)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
