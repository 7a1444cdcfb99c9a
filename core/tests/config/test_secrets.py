"""``servehall.config.secrets``: secrets given literally, by environment variable or by
file; references only where the config text is stored; secret-looking names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from servehall.config.secrets import (
    MASK,
    URL_PASSWORD,
    Secret,
    SecretReference,
    is_secret_name,
    resolve_secret,
    resolve_secret_reference,
)


class _Cfg(BaseModel):
    key: Secret | None = None
    ref: SecretReference | None = None


def test_literal_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SH_TEST_SECRET", "from-env")
    f = tmp_path / "s.txt"
    f.write_text("  from-file\n")
    assert resolve_secret("plain") == "plain"
    assert resolve_secret({"env": "SH_TEST_SECRET"}) == "from-env"
    assert resolve_secret({"file": str(f)}) == "from-file"


def test_unset_variable_and_unreadable_file_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SH_TEST_UNSET", raising=False)
    with pytest.raises(ValueError, match="environment variable SH_TEST_UNSET is not set"):
        resolve_secret({"env": "SH_TEST_UNSET"})
    with pytest.raises(ValueError, match="cannot read secret file"):
        resolve_secret({"file": str(tmp_path / "missing")})


@pytest.mark.parametrize("value", [{"env": "A", "file": "B"}, {"other": 1}, {}])
def test_other_tables_are_refused(value: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="a secret is a string"):
        resolve_secret(value)


def test_a_redacted_secret_asks_for_the_real_one() -> None:
    with pytest.raises(ValueError, match="redacted from a stored config revision"):
        resolve_secret({"redacted": True})


def test_a_reference_field_refuses_a_literal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SH_TEST_SECRET", "s3")
    assert resolve_secret_reference({"env": "SH_TEST_SECRET"}) == "s3"
    assert resolve_secret_reference(None) is None
    with pytest.raises(ValueError, match="never the key itself"):
        resolve_secret_reference("literal")


def test_config_types_mask_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SH_TEST_SECRET", "hunter2")
    cfg = _Cfg.model_validate({"key": "lit", "ref": {"env": "SH_TEST_SECRET"}})
    assert isinstance(cfg.key, SecretStr) and cfg.key.get_secret_value() == "lit"
    assert cfg.ref is not None and cfg.ref.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(cfg) and str(cfg.ref) == MASK
    with pytest.raises(ValidationError):
        _Cfg.model_validate({"ref": "literal"})


@pytest.mark.parametrize(
    "name",
    [
        "secret",
        "password",
        "api_key",
        "apikey",
        "db.password",
        "x-api-key",
        "Authorization",
        "token",
        "AWS_SECRET",
        "private_key",
        "session-cookie",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["keys", "monkey", "tokenizer", "max_tokens", "path", 5, None])
def test_other_names(name: object) -> None:
    assert not is_secret_name(name)


def test_url_password_is_group_two() -> None:
    m = URL_PASSWORD.search("postgresql://user:p4ss@db:5432/x")
    assert m is not None and m.group(2) == "p4ss"
    assert URL_PASSWORD.search("postgresql://db:5432/x") is None
