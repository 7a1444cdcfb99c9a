"""Helpers for backend option models (``[[models]] options`` validated with pydantic).

* :func:`parse_model_options` — validate a raw options table with a pydantic model and
  report every problem as a :class:`~servehall.ConfigError` keyed
  ``models.<name>.options.<key>``;
* :func:`canonical_dtype` — the torch name of a dtype spelling (``bf16`` → ``bfloat16``),
  so every backend accepts the same spellings.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from servehall.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

DTYPE_SPELLINGS: dict[str, str] = {
    "auto": "auto",
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}
"""Accepted dtype spellings (lower case) → torch dtype name (or ``auto``)."""


def canonical_dtype(value: object) -> str | None:
    """The torch dtype name (``float32``/``bfloat16``/``float16``) or ``auto`` for a
    spelling in :data:`DTYPE_SPELLINGS` (case-insensitive); None for anything else."""
    if isinstance(value, str):
        return DTYPE_SPELLINGS.get(value.lower())
    return None


def parse_model_options(model_cls: type[M], raw: dict[str, Any], *, model: str, what: str) -> M:
    """Validate ``raw`` (one model's ``options`` table) as ``model_cls``.

    Args:
        model_cls: the backend's pydantic options model.
        raw: the ``[[models]] options`` table.
        model: the model's name, for the key paths.
        what: the start of the error message, after ``"invalid "`` (e.g.
            ``"openvino_cpu options"``).

    Raises:
        ConfigError: ``"invalid <what>: <key>: <msg>; ..."`` with ``errors`` listing one
            ``("models.<model>.options.<key>", message)`` pair per validation error.
    """
    try:
        return model_cls.model_validate(raw)
    except ValidationError as exc:
        errors = [
            (".".join(["models", model, "options", *(str(p) for p in e["loc"])]), e["msg"])
            for e in exc.errors()
        ]
        detail = "; ".join(f"{k}: {m}" for k, m in errors)
        raise ConfigError(f"invalid {what}: {detail}", errors) from None
