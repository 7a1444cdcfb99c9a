"""Refuse a ``[[models]] path`` that is not a model directory, before any backend work.

A served model directory is a Hugging Face export (``config.json``) or an OpenVINO IR
export (``openvino_model.xml``, usually next to a ``config.json``), and in both cases
holds the tokenizer files servehall's tokenizer reads through ``transformers``
(``tokenizer.json``, ``tokenizer_config.json``, ``tokenizer.model`` or ``vocab.json``).
Without this check an empty or wrong directory surfaced as whatever ``transformers``
happened to fail on first (e.g. "requires the protobuf library").
"""

from __future__ import annotations

from pathlib import Path

from servehall.errors import ConfigError

MODEL_FILES: tuple[str, ...] = ("config.json", "openvino_model.xml")
"""Any one of these marks a Hugging Face or OpenVINO model directory."""

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
)
"""Any one of these marks tokenizer files ``transformers.AutoTokenizer`` can load."""


def check_model_dir(name: str, path: Path) -> None:
    """Raise unless ``path`` looks like a loadable model directory.

    Args:
        name: the ``[[models]] name`` (for the message).
        path: the ``[[models]] path``.

    Raises:
        ConfigError: one line naming ``models.NAME.path``: the path does not exist, is
            not a directory, or lacks model files or tokenizer files.
    """
    where = f"models.{name}.path"
    if not path.exists():
        raise ConfigError(f"{where}: {path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"{where}: {path} is not a directory (give the model directory)")
    missing = [
        what
        for what, files in (("config.json", MODEL_FILES), ("tokenizer files", TOKENIZER_FILES))
        if not any((path / f).is_file() for f in files)
    ]
    if missing:
        raise ConfigError(
            f"{where}: {path} is not a Hugging Face or OpenVINO model directory "
            f"(no {' / '.join(missing)})"
        )
