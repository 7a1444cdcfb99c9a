"""The [auth] section: validation errors, secret masking, import-light entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from servehall_auth.cli import parse_duration, parse_expires
from servehall_auth.settings import AuthSettings


def test_pepper_required_and_long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="pepper"):
        AuthSettings()
    with pytest.raises(ValidationError, match="16"):
        AuthSettings(pepper="short")  # type: ignore[arg-type]
    monkeypatch.setenv("MY_PEPPER", "p" * 32)
    s = AuthSettings(pepper={"env": "MY_PEPPER"})  # type: ignore[arg-type]
    assert s.pepper is not None and s.pepper.get_secret_value() == "p" * 32
    assert "p" * 32 not in repr(s) and "p" * 32 not in s.model_dump_json()
    with pytest.raises(ValidationError, match="NOT_SET_ANYWHERE"):
        AuthSettings(pepper={"env": "NOT_SET_ANYWHERE"})  # type: ignore[arg-type]


def test_unknown_keys_and_nothing_to_log_in_with() -> None:
    with pytest.raises(ValidationError):
        AuthSettings(pepper="p" * 16, peper="typo")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="nothing could log in"):
        AuthSettings(api_keys=False)


def test_jwt_algorithms_pinned(tmp_path: Path) -> None:
    jwks = tmp_path / "j.json"
    jwks.write_text(json.dumps({"keys": []}))
    base = {"issuer": "i", "audience": "a", "jwks_file": str(jwks)}
    for bad in (["none"], ["HS256"], []):
        with pytest.raises(ValidationError):
            AuthSettings(api_keys=False, jwt={**base, "algorithms": bad})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):  # issuer and audience are required
        AuthSettings(api_keys=False, jwt={"algorithms": ["RS256"], "jwks_file": str(jwks)})  # type: ignore[arg-type]
    s = AuthSettings(api_keys=False, jwt={**base, "algorithms": ["ES256"]})  # type: ignore[arg-type]
    assert s.jwt is not None and s.jwt.audience == ["a"]


def test_durations_and_expiry() -> None:
    assert parse_duration("90").total_seconds() == 90
    assert parse_duration("15m").total_seconds() == 900
    assert parse_duration("2d").total_seconds() == 172800
    with pytest.raises(ValueError):
        parse_duration("soon")
    e = parse_expires("2027-01-31")
    assert e.isoformat() == "2027-01-31T00:00:00+00:00"
    assert parse_expires("2027-01-31T12:00:00+02:00").hour == 10
    with pytest.raises(ValueError):
        parse_expires("next tuesday")


def test_entry_point_is_import_light() -> None:
    code = (
        "import sys, servehall_auth.plugin; "
        "heavy = [m for m in ('torch', 'jwt', 'sqlalchemy.ext.asyncio', 'openvino') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
