"""The stored form of a config: literal secrets redacted, references kept, restored from
the running config (servehall.config.redact)."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from servehall import Secret
from servehall.config.redact import (
    REDACTED,
    key_path,
    redact_text,
    restore_secrets,
    secret_paths,
)
from servehall.config.secrets import MASK
from servehall.config.settings import Settings, load_settings, parse_config_text
from servehall.errors import ConfigError
from servehall.records.codec import redact


class Vault(BaseModel):
    """A plugin section with a typed secret and a secret-free field."""

    jwt_secret: Secret | None = None
    webhook: Secret | None = None
    region: str = "eu"


TOML = """\
# the deployment
[database]
url = "postgresql+asyncpg://svc:db-pass-123@db:5432/servehall"  # literal: redacted

[tracing]
headers = { authorization = "Bearer trace-tok-456", x-team = { env = "TEAM_TOKEN" } }

[vault]
jwt_secret = "jwt-secret-789"
webhook = { env = "VAULT_WEBHOOK" }
region = "us"

[[models]]
name = "m"
version = "a"
path = "/models/m"
[models.options]
api_key = "sk-live-abc"
hf_token = "hf_tok_def"
dtype = "bf16"
nested = { password = "pw-ghi" }

[[models]]
name = "m"
version = "b"
path = "/models/m"
options = { api_key = { env = "M_KEY" }, endpoint = "https://u:url-pw-jkl@host/v1" }

[[sinks]]
name = "webhook"
options = { url = "https://hooks.example/x", token = "sink-tok-mno" }
"""

LITERALS = [
    "db-pass-123",
    "trace-tok-456",
    "jwt-secret-789",
    "sk-live-abc",
    "hf_tok_def",
    "pw-ghi",
    "url-pw-jkl",
    "sink-tok-mno",
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEAM_TOKEN", "VAULT_WEBHOOK", "M_KEY"):
        monkeypatch.setenv(name, f"value-of-{name}")


def _settings(data: dict[str, Any]) -> Settings:
    return load_settings(data=data, section_models={"vault": Vault})


def test_secret_paths_come_from_the_models_and_option_names(env: None) -> None:
    raw = parse_config_text(TOML, "toml")
    paths = {key_path(p) for p in secret_paths(raw, _settings(raw))}
    assert paths == {
        "database.url",
        "tracing.headers.authorization",
        "vault.jwt_secret",
        "models[0].options.api_key",
        "models[0].options.hf_token",
        "models[0].options.nested.password",
        "models[1].options.endpoint",
        "sinks[0].options.token",
    }


def test_toml_keeps_references_comments_and_layout(env: None) -> None:
    raw = parse_config_text(TOML, "toml")
    stored = redact_text(TOML, "toml", _settings(raw))
    for literal in LITERALS:
        assert literal not in stored
    assert "# the deployment" in stored and "# literal: redacted" in stored
    data = tomllib.loads(stored)
    assert data["database"]["url"] == REDACTED
    assert data["tracing"]["headers"]["x-team"] == {"env": "TEAM_TOKEN"}
    assert data["vault"] == {
        "jwt_secret": REDACTED,
        "webhook": {"env": "VAULT_WEBHOOK"},
        "region": "us",
    }
    assert data["models"][0]["options"]["dtype"] == "bf16"
    assert data["models"][1]["options"]["api_key"] == {"env": "M_KEY"}
    assert data["sinks"][0]["options"]["url"] == "https://hooks.example/x"
    # only the secrets' lines changed
    changed = set(stored.splitlines()) - set(TOML.splitlines())
    assert len(changed) == 8, changed
    assert len(stored.splitlines()) == len(TOML.splitlines())


def test_a_config_without_literal_secrets_is_stored_as_written(env: None) -> None:
    text = '[database]\nurl = { env = "DB_URL" }\n\n[[models]]\nname = "m"\npath = "/m"\n'
    raw = parse_config_text(text, "toml")
    settings = _settings({**raw, "database": {"url": "sqlite+aiosqlite:///x.db"}})
    assert redact_text(text, "toml", settings) == text


def test_yaml_is_redacted_too(env: None) -> None:
    data = tomllib.loads(TOML)
    text = yaml.safe_dump(data, sort_keys=False)
    stored = redact_text(text, "yaml", _settings(data))
    for literal in LITERALS:
        assert literal not in stored
    assert yaml.safe_load(stored)["vault"]["jwt_secret"] == REDACTED


def test_restore_takes_secrets_from_the_running_config(env: None) -> None:
    running = parse_config_text(TOML, "toml")
    stored = parse_config_text(redact_text(TOML, "toml", _settings(running)), "toml")
    stored["models"].reverse()  # entries match by name and version, not position
    back = restore_secrets(stored, running)
    assert back["models"][1]["options"]["api_key"] == "sk-live-abc"
    assert back["models"][1]["options"]["nested"]["password"] == "pw-ghi"
    assert back["models"][0]["options"]["endpoint"] == "https://u:url-pw-jkl@host/v1"
    assert back["database"]["url"] == running["database"]["url"]
    assert back["vault"]["webhook"] == {"env": "VAULT_WEBHOOK"}
    assert _settings(back).models[1].options["api_key"] == "sk-live-abc"


def test_restore_refuses_a_secret_the_running_config_lacks_naming_each_field(
    env: None,
) -> None:
    running = parse_config_text(TOML, "toml")
    stored = parse_config_text(redact_text(TOML, "toml", _settings(running)), "toml")
    running["models"] = running["models"][1:]  # version a is no longer running
    del running["vault"]["jwt_secret"]
    with pytest.raises(ConfigError) as info:
        restore_secrets(stored, running)
    fields = [k for k, _ in info.value.errors]
    assert fields == [
        "vault.jwt_secret",
        "models[0].options.api_key",
        "models[0].options.hf_token",
        "models[0].options.nested.password",
    ]
    assert "env" in info.value.message and "models[0].options.api_key" in info.value.message


def test_an_unrestored_marker_in_a_secret_field_is_a_clear_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(data={"database": {"url": dict(REDACTED)}})
    assert "redacted from a stored config revision" in info.value.message


def test_audit_redaction_shares_the_secret_key_names() -> None:
    out = redact({"hf_key": "x", "webhook_token": "y", "url": "redis://u:pw@h/0", "n": 1})
    assert out == {"hf_key": MASK, "webhook_token": MASK, "url": f"redis://u:{MASK}@h/0", "n": 1}


def test_config_show_masks_option_secrets_and_url_passwords(env: None) -> None:
    from servehall.config.settings import masked_dump

    shown = json.dumps(masked_dump(_settings(parse_config_text(TOML, "toml"))))
    for literal in LITERALS:
        assert literal not in shown, literal
    assert '"dtype": "bf16"' in shown and "postgresql+asyncpg://svc:**********@db" in shown


def test_live_config_stores_redacted_text_and_restores_it_on_apply(tmp_path: Any) -> None:
    """LiveConfig (servehall.rollout.live): its text (what /admin/config shows and a
    revision stores) has no literal secret; a stored text posted back validates with the
    running secrets; a marker for a version that is not running is refused by name."""
    from servehall.plugin.host import Host
    from servehall.plugin.manager import PluginHost
    from servehall.rollout.live import LiveConfig

    def text(versions: list[str]) -> str:
        out = '[database]\nurl = "postgresql+asyncpg://u:live-db-pw@h/db"\n'
        for v in versions:
            out += (
                f'\n[[models]]\nname = "m"\nversion = "{v}"\npath = "{tmp_path}"\n'
                f'backend = "null"\noptions = {{ api_key = "live-key-{v}" }}\n'
            )
        return out

    running = text(["a"])
    host = Host(settings=load_settings(data=tomllib.loads(running)), plugins=PluginHost([]))
    live = LiveConfig(host, None, running, "toml", None)  # type: ignore[arg-type]
    assert "live-db-pw" not in live.text and "live-key-a" not in live.text
    new, data = live.validate(tomllib.loads(live.text))
    assert data["models"][0]["options"]["api_key"] == "live-key-a"
    assert new.database.url.get_secret_value().endswith("live-db-pw@h/db")
    two = parse_config_text(
        redact_text(text(["a", "b"]), "toml", _settings(tomllib.loads(text(["a", "b"])))), "toml"
    )
    with pytest.raises(ConfigError) as info:
        live.validate(two)
    assert [k for k, _ in info.value.errors] == ["models[1].options.api_key"]
