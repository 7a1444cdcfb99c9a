"""model_dir.check_model_dir: which ``[[models]] path`` values are refused, and how."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.engines.model_dir import check_model_dir
from servehall.errors import ConfigError


def test_refusals_name_the_setting_and_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^models\.m\.path: .* does not exist$"):
        check_model_dir("m", tmp_path / "nope")
    (tmp_path / "weights.gguf").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir("m", tmp_path / "weights.gguf")
    with pytest.raises(ConfigError, match=r"\(no config\.json / tokenizer files\)$"):
        check_model_dir("m", tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"model directory \(no tokenizer files\)$"):
        check_model_dir("m", tmp_path)


def test_hugging_face_and_openvino_directories_pass(tmp_path: Path) -> None:
    hf, ov = tmp_path / "hf", tmp_path / "ov"
    hf.mkdir()
    ov.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text("{}")
    (ov / "openvino_model.xml").write_text("<net/>")
    (ov / "tokenizer_config.json").write_text("{}")
    check_model_dir("hf", hf)
    check_model_dir("ov", ov)
