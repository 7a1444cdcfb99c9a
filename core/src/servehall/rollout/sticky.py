"""Canary rollbacks that stick: the ``rolled_back`` table of a ``[[models]]`` entry.

The guard (:mod:`servehall.rollout.guard`) takes a canary out of rotation by storing a
config revision made by :func:`mark`: the version's entry gets ``weight = 0`` and a
``rolled_back`` table (:class:`~servehall.config.models.RolledBack`) that keeps the
weight it had, the reason and the figures. Every config stored afterwards — ``POST
/admin/config``, SIGHUP, ``servehall config apply | rollback``, a replica's start from
its file — first passes through :func:`keep` against the newest stored config:

* an entry of that version with the same weight as before and no ``rolled_back`` table
  (the operator's file, unchanged on that point) keeps the rollback: it is stored with
  ``weight = 0`` and the table;
* another weight is the operator setting it explicitly: applied as written;
* the table kept with a weight above 0 (the stored text edited back) ends the rollback
  too: the table is dropped.

TOML keeps its comments and layout (tomlkit edits only those keys); YAML is re-dumped
(comments are lost), as :mod:`servehall.config.redact` does. A text with nothing to
change is returned unchanged, so a replica restarting from the file the rollback was
made from stores the very same text (and adopts that revision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FIELD = "rolled_back"
"""The ``[[models]]`` key the marker lives in."""

DEFAULT_WEIGHT = 1.0
"""``[[models]] weight`` when an entry leaves it out."""

Entry = Any  # a mutable mapping: a tomlkit table or a plain dict (YAML)


def version_key(entry: object) -> tuple[str, str] | None:
    """``(name, version)`` of a ``[[models]]`` entry (parsed or tomlkit), or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    version = entry.get("version", "")
    return str(entry["name"]), str(version) if isinstance(version, str) else ""


def _weight(entry: Entry) -> float:
    value = entry.get("weight", DEFAULT_WEIGHT)
    return float(value) if isinstance(value, int | float) else DEFAULT_WEIGHT


def _others_weighted(entries: list[Entry], entry: Entry) -> bool:
    """True when another version of ``entry``'s name has a weight above 0."""
    name = (version_key(entry) or ("", ""))[0]
    return any(
        e is not entry and (version_key(e) or ("", ""))[0] == name and _weight(e) > 0
        for e in entries
    )


def _plain(value: Any) -> Any:
    """A tomlkit item as the plain Python value (int, float, str, dict)."""
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if callable(unwrap) else value


def _edit(text: str, fmt: str, change: Callable[[list[Entry]], bool]) -> str:
    """``text`` after ``change(entries)`` edited its ``[[models]]`` entries in place;
    ``text`` itself when ``change`` returns False (nothing changed)."""
    if fmt == "yaml":
        import yaml

        raw = yaml.safe_load(text) or {}
        models = raw.get("models") if isinstance(raw, dict) else None
        if not isinstance(models, list) or not change(models):
            return text
        return str(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    import tomlkit

    doc = tomlkit.parse(text)
    models = doc.get("models")
    if not isinstance(models, list) or not change(models):
        return text
    return tomlkit.dumps(doc)


def _table(fmt: str, values: dict[str, Any]) -> Any:
    if fmt == "yaml":
        return dict(values)
    import tomlkit

    table = tomlkit.inline_table()
    table.update(values)
    return table


def mark(text: str, fmt: str, name: str, version: str, marker: dict[str, Any]) -> str | None:
    """``text`` (a stored config, ``toml``/``yaml``) with version ``name``/``version`` at
    ``weight = 0`` and ``rolled_back = {weight = <its weight>, **marker}``.

    None when there is nothing to store: the entry is absent, already at weight 0, or
    the only version of ``name`` with a weight above 0 (a name needs one).
    """
    done: list[bool] = []

    def change(entries: list[Entry]) -> bool:
        target = next((e for e in entries if version_key(e) == (name, version)), None)
        if target is None or _weight(target) == 0 or not _others_weighted(entries, target):
            return False
        was = _plain(target.get("weight", DEFAULT_WEIGHT))
        target["weight"] = 0
        target[FIELD] = _table(fmt, {"weight": was, **marker})
        done.append(True)
        return True

    out = _edit(text, fmt, change)
    return out if done else None


def rolled_back(models: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The ``rolled_back`` tables of parsed ``[[models]]`` entries at weight 0, by
    ``(name, version)``."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in models:
        key = version_key(entry)
        table = entry.get(FIELD) if key is not None else None
        if key is not None and isinstance(table, dict) and _weight(entry) == 0:
            out[key] = dict(table)
    return out


def keep(text: str, fmt: str, previous: list[Any]) -> tuple[str, list[str]]:
    """``text`` with the rollbacks of ``previous`` (the newest stored config's parsed
    ``[[models]]``) kept as the module docstring says, and the keys (``name@version``)
    of the versions it kept at weight 0."""
    markers = rolled_back(previous)
    kept: list[str] = []

    def change(entries: list[Entry]) -> bool:
        changed = False
        for entry in entries:
            key = version_key(entry)
            if key is None:
                continue
            if FIELD in entry:
                if _weight(entry) > 0:  # the stored text edited back: explicit
                    del entry[FIELD]
                    changed = True
                continue
            marker = markers.get(key)
            if marker is None or _weight(entry) != float(marker.get("weight", -1)):
                continue
            if not _others_weighted(entries, entry):
                continue  # the only weighted version of its name: the config says so
            entry["weight"] = 0
            entry[FIELD] = _table(fmt, marker)
            kept.append(f"{key[0]}@{key[1]}" if key[1] else key[0])
            changed = True
        return changed

    return _edit(text, fmt, change), kept
