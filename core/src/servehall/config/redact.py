"""The stored form of a config: literal secrets replaced by a redaction marker.

A config revision (:mod:`servehall.rollout.revisions`) and everything that shows one
(``servehall config history --diff``, ``GET /admin/config``) holds a config's text with
each *literal* secret replaced by ``{ redacted = true }``; a secret written as a
reference (``{ env = "NAME" }`` / ``{ file = "/path" }``) stays the reference.

Which values are secrets (one rule for every section, the core's and the plugins'):

* a typed setting is a secret when its model declares it :data:`~servehall.config.Secret`
  (pydantic ``SecretStr``), found from the validated settings, not from a list of names;
* inside a free-form table (``[[models]] options``, ``[[sinks]] options``, any
  ``dict[str, Any]`` setting) a string is a secret when its key looks like one
  (:func:`~servehall.config.secrets.is_secret_name`: ``api_key``, ``password``,
  ``token``, ``secret`` …) or it is a URL with a password (``scheme://user:pw@host``).

Applying a stored revision again (a follower replica, ``config rollback``, a text posted
back to ``/admin/config``) first puts each marker's secret back from the running config
(:func:`restore_secrets`): the same key of the same section, or of the ``[[models]]``
entry with the same ``name`` and ``version``. A marker the running config has no value
for is refused, naming the field. TOML keeps its comments and layout (tomlkit); YAML
with a literal secret is stored re-dumped (comments are lost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr

from servehall.config.secrets import URL_PASSWORD, is_secret_name
from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.config.settings import Settings

KeyPath = tuple[str | int, ...]
REDACTED: dict[str, bool] = {"redacted": True}
"""The marker a literal secret is replaced by (``{ redacted = true }``)."""


def is_redacted(value: object) -> bool:
    """True for the redaction marker."""
    return isinstance(value, dict) and value == REDACTED


def key_path(path: KeyPath) -> str:
    """``models[0].options.api_key`` for ``("models", 0, "options", "api_key")``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _free(raw: Any, path: KeyPath, out: list[KeyPath], name: object = None) -> None:
    """Literal secrets in free-form data: by key name, or a URL with a password."""
    if isinstance(raw, str):
        if is_secret_name(name) or ("://" in raw and URL_PASSWORD.search(raw)):
            out.append(path)
    elif isinstance(raw, dict):
        for k, v in raw.items():
            _free(v, (*path, k), out, k)
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            _free(v, (*path, i), out, name)


def _walk(raw: Any, value: Any, path: KeyPath, out: list[KeyPath]) -> None:
    """Literal secrets in ``raw`` (parsed file data), guided by ``value`` (the same data
    validated: a ``SecretStr`` marks a secret, a plain dict/list is free-form)."""
    if isinstance(value, SecretStr):
        if isinstance(raw, str):  # else a reference ({env}/{file}) or the marker
            out.append(path)
    elif isinstance(value, BaseModel):
        if isinstance(raw, dict):
            fields = type(value).model_fields
            extra = value.__pydantic_extra__ or {}
            for k, v in raw.items():
                if k in fields:
                    _walk(v, getattr(value, k), (*path, k), out)
                elif k in extra:
                    _walk(v, extra[k], (*path, k), out)
    elif isinstance(value, dict) and isinstance(raw, dict):
        for k, v in raw.items():
            if k in value and isinstance(value[k], BaseModel | SecretStr | dict | list):
                _walk(v, value[k], (*path, k), out)
            else:
                _free(v, (*path, k), out, k)
    elif isinstance(value, list | tuple) and isinstance(raw, list):
        for i, v in enumerate(raw):
            if i < len(value):
                _walk(v, value[i], (*path, i), out)
    elif not is_redacted(raw):
        _free(raw, path, out)


def secret_paths(raw: dict[str, Any], settings: Settings) -> list[KeyPath]:
    """The key paths of ``raw`` (a parsed config file) that hold a literal secret.

    ``settings`` is ``raw`` validated (plugin sections too, so their ``Secret`` fields
    are known); a section it does not know is searched as free-form data.
    """
    out: list[KeyPath] = []
    _walk(raw, settings, (), out)
    return out


def _set(doc: Any, path: KeyPath, value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def redact_text(text: str, fmt: str, settings: Settings) -> str:
    """``text`` (format ``toml``/``yaml``) with every literal secret replaced by
    ``{ redacted = true }``; unchanged when it holds none.

    Raises:
        ConfigError: ``text`` does not parse.
        RuntimeError: a secret survived (a bug: never stored).
    """
    from servehall.config.settings import parse_config_text

    if not text:
        return text
    raw = parse_config_text(text, fmt)
    paths = secret_paths(raw, settings)
    if not paths:
        return text
    if fmt == "yaml":
        import yaml

        for path in paths:
            _set(raw, path, dict(REDACTED))
        stored = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    else:
        import tomlkit

        doc = tomlkit.parse(text)
        for path in paths:
            marker = tomlkit.inline_table()
            marker.update(REDACTED)
            _set(doc, path, marker)
        stored = tomlkit.dumps(doc)
    left = secret_paths(parse_config_text(stored, fmt), settings)
    if left:
        raise RuntimeError(f"redaction left secrets at {', '.join(map(key_path, left))}")
    return stored


def _find(running: Any, data_elem: Any, index: int) -> Any:
    """The element of the list ``running`` that matches ``data_elem`` (same ``name`` and
    ``version`` for named entries, else the same index), or None."""
    if not isinstance(running, list):
        return None
    if isinstance(data_elem, dict) and "name" in data_elem:
        for r in running:
            if (
                isinstance(r, dict)
                and r.get("name") == data_elem["name"]
                and r.get("version", "") == data_elem.get("version", "")
            ):
                return r
        return None
    return running[index] if index < len(running) else None


_MISSING = object()


def _restore(data: Any, running: Any, path: KeyPath, errs: list[tuple[str, str]]) -> Any:
    if is_redacted(data):
        if running is _MISSING or running is None or isinstance(running, bool | int | float):
            errs.append(
                (
                    key_path(path),
                    "a literal secret is not kept in stored config revisions and the running "
                    "config has no value for it: write it in the config file (better: "
                    '{ env = "NAME" } or { file = "/path" }) and apply that file',
                )
            )
            return data
        return running
    if isinstance(data, dict):
        src = running if isinstance(running, dict) else {}
        return {k: _restore(v, src.get(k, _MISSING), (*path, k), errs) for k, v in data.items()}
    if isinstance(data, list):
        return [
            _restore(v, _opt(_find(running, v, i)), (*path, i), errs) for i, v in enumerate(data)
        ]
    return data


def _opt(value: Any) -> Any:
    return _MISSING if value is None else value


def restore_secrets(data: dict[str, Any], running: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a parsed stored config) with each ``{ redacted = true }`` replaced by
    the running config's value at the same place (``running``: the parsed file the
    replica runs, with its real secrets; a ``[[models]]`` entry matches by ``name`` and
    ``version``). A value that is itself a marker passes (the ``config rollback`` CLI
    checks a revision against the newest stored one).

    Raises:
        ConfigError: every marker without a value, by key path (nothing is applied).
    """
    errs: list[tuple[str, str]] = []
    out = _restore(data, running, (), errs)
    if errs:
        lines = "\n".join(f"  {k}: {m}" for k, m in errs)
        raise ConfigError(
            f"config not applied, nothing changed: {len(errs)} redacted secret(s) unknown:\n"
            f"{lines}",
            errs,
        )
    return out
