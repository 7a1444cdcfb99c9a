"""Loading, validating and showing the deployment's config.

Sources, highest priority first: environment variables ``SERVEHALL_<SECTION>__<KEY>``
(JSON for lists/tables, e.g. ``SERVEHALL_SERVER__BIND='["0.0.0.0:8000"]'``), the TOML
(or YAML) file given by ``--config`` or ``SERVEHALL_CONFIG``, then defaults. Plugin
sections are validated by the models plugins return from ``servehall_settings_models``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from servehall.config.models import (
    AuditSettings,
    BatchesSettings,
    DatabaseSettings,
    FilesSettings,
    ModelConfig,
    ModelStoreSettings,
    PluginsSettings,
    ResponsesSettings,
    SchedulerSettings,
    ServerSettings,
    SinkConfig,
    TracingSettings,
)
from servehall.config.secrets import MASK, URL_PASSWORD, is_secret_name
from servehall.errors import ConfigError

ENV_PREFIX = "SERVEHALL_"
CORE_SECTIONS = (
    "plugins",
    "server",
    "models",
    "scheduler",
    "database",
    "sinks",
    "tracing",
    "audit",
    "files",
    "batches",
    "responses",
    "model_store",
)


class Settings(BaseSettings):
    """The whole effective config. Unknown top-level sections are kept for plugins
    (``plugin_sections``) and validated against the plugins' models."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="allow",
        case_sensitive=False,
    )

    plugins: PluginsSettings = Field(default_factory=PluginsSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    models: list[ModelConfig] = Field(default_factory=list)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    sinks: list[SinkConfig] = Field(default_factory=lambda: [SinkConfig(name="sql")])
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    files: FilesSettings = Field(default_factory=FilesSettings)
    batches: BatchesSettings = Field(default_factory=BatchesSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    model_store: ModelStoreSettings = Field(default_factory=ModelStoreSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's contents arrive as init kwargs; environment variables override them.
        return (env_settings, init_settings)

    @property
    def plugin_sections(self) -> dict[str, Any]:
        """Raw (or, after :func:`validate_plugin_sections`, validated) plugin sections."""
        return dict(self.__pydantic_extra__ or {})

    def section(self, name: str) -> Any:
        """A plugin section by name (its validated model), or None when absent."""
        return (self.__pydantic_extra__ or {}).get(name)

    def model(self, name: str) -> ModelConfig:
        """The ``[[models]]`` entry called ``name``; ConfigError otherwise."""
        for m in self.models:
            if m.name == name:
                return m
        raise ConfigError(f"no model named {name!r} in config")


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file into a dict.

    Raises ConfigError naming the file and the parse problem.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return parse_config_text(raw, config_format(path), str(path))


def config_format(path: Path) -> str:
    """``"yaml"`` for ``.yaml``/``.yml`` files, else ``"toml"``."""
    return "yaml" if path.suffix in (".yaml", ".yml") else "toml"


def parse_config_text(raw: bytes | str, fmt: str, origin: str = "config") -> dict[str, Any]:
    """Parse config text in format ``fmt`` (``toml`` or ``yaml``) into a dict.

    Raises ConfigError naming ``origin`` and the parse problem.
    """
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (from a JSON "\ud800" escape)
            raise ConfigError(f"{origin}: not valid Unicode (a lone surrogate)") from None
    if fmt == "yaml":
        try:
            import yaml  # optional dependency
        except ImportError:
            raise ConfigError("YAML config needs PyYAML: pip install pyyaml") from None
        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{origin}: invalid YAML: {exc}") from None
    else:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a table")
    return data


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _errors(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    errs = []
    for e in exc.errors():
        path = _loc(tuple(e["loc"]))
        errs.append((f"{prefix}.{path}" if prefix and path else prefix or path, e["msg"]))
    return errs


def _env_overrides(section: str) -> dict[str, Any]:
    """``SERVEHALL_<SECTION>__<KEY>`` variables for a plugin section (JSON values allowed)."""
    prefix = f"{ENV_PREFIX}{section.upper()}__"
    out: dict[str, Any] = {}
    for key, value in os.environ.items():
        if key.upper().startswith(prefix):
            field = key[len(prefix) :].lower()
            try:
                out[field] = json.loads(value)
            except ValueError:
                out[field] = value
    return out


def _env_error(exc: SettingsError) -> tuple[str, str]:
    """Name the environment variables behind a pydantic-settings parse error."""
    match = re.search(r'field "(\w+)"', str(exc))
    section = match.group(1) if match else ""
    prefix = f"{ENV_PREFIX}{section.upper()}"
    names = sorted(k for k in os.environ if section and k.upper().startswith(prefix))
    shown = ", ".join(names) or f"{prefix}*"
    return (
        section or "environment",
        f"cannot parse environment override {shown}: lists and tables must be JSON, "
        f"e.g. {ENV_PREFIX}SERVER__BIND='[\"0.0.0.0:8000\"]'",
    )


def load_settings(
    path: Path | str | None = None,
    *,
    data: dict[str, Any] | None = None,
    section_models: dict[str, type[BaseModel]] | None = None,
) -> Settings:
    """Build the effective :class:`Settings`.

    Args:
        path: config file; when None, ``$SERVEHALL_CONFIG`` if set, else defaults only.
        data: already-parsed file contents (instead of ``path``).
        section_models: ``{section: model}`` from plugins; when given, every plugin
            section is validated (missing sections get the model's defaults) and unknown
            sections are errors.

    Raises:
        ConfigError: with ``errors`` = every ``(key_path, message)`` found.
    """
    if data is None:
        env_path = os.environ.get(f"{ENV_PREFIX}CONFIG")
        chosen = Path(path) if path is not None else (Path(env_path) if env_path else None)
        data = read_config_file(chosen.expanduser()) if chosen else {}
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        errs = _errors(exc)
        raise ConfigError(_summary(errs), errs) from None
    except SettingsError as exc:  # an environment override that is not valid JSON
        errs = [_env_error(exc)]
        raise ConfigError(_summary(errs), errs) from None
    if section_models is not None:
        validate_plugin_sections(settings, section_models)
    return settings


def validate_plugin_sections(settings: Settings, models: dict[str, type[BaseModel]]) -> None:
    """Replace raw plugin sections by validated models; ConfigError lists every problem."""
    extra = settings.__pydantic_extra__
    if extra is None:
        extra = {}
        object.__setattr__(settings, "__pydantic_extra__", extra)
    errs: list[tuple[str, str]] = []
    for name in sorted(set(extra) - set(models)):
        known = ", ".join(sorted([*CORE_SECTIONS, *models]))
        errs.append((name, f"unknown config section (known sections: {known})"))
    for name, model in models.items():
        raw = extra.get(name) or {}
        if isinstance(raw, BaseModel):
            continue
        if not isinstance(raw, dict):
            errs.append((name, "must be a table"))
            continue
        raw = {**raw, **_env_overrides(name)}
        try:
            extra[name] = model(**raw)
        except ValidationError as exc:
            errs.extend(_errors(exc, prefix=name))
    if errs:
        raise ConfigError(_summary(errs), errs)


def _summary(errs: list[tuple[str, str]]) -> str:
    if len(errs) == 1:  # one problem, one line (it names the section, i.e. the plugin)
        return f"config error: {errs[0][0]}: {errs[0][1]}"
    lines = [f"  {k}: {m}" for k, m in errs[:50]]
    more = f"\n  … and {len(errs) - 50} more" if len(errs) > 50 else ""
    return f"{len(errs)} config error(s):\n" + "\n".join(lines) + more


_DB_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb"})


def _mask_secret(secret: SecretStr) -> str:
    """``**********``, or for a database URL the URL with its password (only) hidden, so
    an operator sees where records go. Other secrets (tokens, webhook URLs) stay masked."""
    value = secret.get_secret_value()
    parts = urlsplit(value)
    if parts.scheme.split("+")[0] in _DB_SCHEMES and not parts.query:
        if parts.password is None:
            return value
        netloc = parts.netloc.replace(f":{parts.password}@", f":{MASK}@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    return MASK


def _mask(value: Any) -> Any:
    """Secrets masked: ``Secret`` fields, and in free-form tables (``options``) strings
    under secret-looking keys; the password of any URL (the rule of
    :mod:`servehall.config.redact`)."""
    if isinstance(value, SecretStr):
        return _mask_secret(value)
    if isinstance(value, BaseModel):
        return {k: _mask(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, dict):
        return {
            k: MASK if is_secret_name(k) and isinstance(v, str) else _mask(v)
            for k, v in value.items()
        }
    if isinstance(value, str) and "://" in value:
        return URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", value)
    if isinstance(value, list | tuple):
        return [_mask(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def masked_dump(settings: Settings) -> dict[str, Any]:
    """The effective config as plain data with every secret shown as ``**********``."""
    out: dict[str, Any] = {k: _mask(getattr(settings, k)) for k in CORE_SECTIONS}
    for name, value in settings.plugin_sections.items():
        out[name] = _mask(value)
    return out
