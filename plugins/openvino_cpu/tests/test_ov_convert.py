"""openvino_cpu: Hugging Face → OpenVINO IR conversion, its cache and its lock."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servehall import ConfigError
from servehall_openvino_cpu import convert
from servehall_openvino_cpu.convert import MARKER, is_ir_dir, resolve_ir_dir, source_key


def test_conversion_output_is_a_complete_ir(ov_ir_dir: Path, ov_demo_dir: Path) -> None:
    assert is_ir_dir(ov_ir_dir)
    for name in ("openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
        assert (ov_ir_dir / name).is_file(), name
    marker = json.loads((ov_ir_dir / MARKER).read_text())
    assert marker["source"] == str(ov_demo_dir.resolve())
    assert marker["weight_format"] == "fp32" and marker["versions"]["openvino"]
    assert not (ov_ir_dir / "convert.log").exists()


def test_cache_is_reused(ov_ir_dir: Path, ov_demo_dir: Path, ov_cache_dir: Path) -> None:
    def entries() -> list[str]:
        return sorted(p.name for p in ov_cache_dir.iterdir() if not p.name.startswith("."))

    before = (ov_ir_dir / MARKER).stat().st_mtime_ns
    # the session's cache may also hold other weight formats' conversions
    # (test_ov_quantized.py): nothing is added to it, whatever ran first
    listed = entries()
    assert ov_ir_dir.name in listed
    assert resolve_ir_dir(ov_demo_dir, cache_dir=ov_cache_dir) == ov_ir_dir
    assert (ov_ir_dir / MARKER).stat().st_mtime_ns == before
    # an IR directory is served as it is
    assert resolve_ir_dir(ov_ir_dir, cache_dir=ov_cache_dir) == ov_ir_dir
    assert entries() == listed


def test_key_follows_content_not_location(ov_demo_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(ov_demo_dir, copy)
    assert source_key(copy, "fp32") == source_key(ov_demo_dir, "fp32")
    assert source_key(copy, "fp16") != source_key(ov_demo_dir, "fp32")
    gen = json.loads((copy / "generation_config.json").read_text())
    gen["do_sample"] = True
    (copy / "generation_config.json").write_text(json.dumps(gen))
    assert source_key(copy, "fp32") != source_key(ov_demo_dir, "fp32")


def test_rejects_a_directory_that_is_no_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ConfigError, match="neither an OpenVINO IR"):
        resolve_ir_dir(tmp_path, cache_dir=tmp_path / "cache")


def test_without_the_exporter_a_hf_dir_is_a_clear_config_error(
    ov_demo_dir: Path, ov_ir_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plugin installed from its wheel (optimum-intel is not a declared dependency): a
    Hugging Face directory gets one clear error naming the install line, before any
    child exporter starts; an IR directory still works."""
    assert convert.exporter_installed()  # this environment has it (scripts/install.sh)
    real = convert.metadata.version

    def version(dist: str) -> str:
        if dist == "optimum-intel":
            raise convert.metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(convert.metadata, "version", version)
    monkeypatch.setattr(convert, "_run_export", lambda *a, **k: pytest.fail("exporter ran"))
    assert not convert.exporter_installed()
    with pytest.raises(ConfigError, match=r"needs optimum-intel.*pip install --no-deps"):
        resolve_ir_dir(ov_demo_dir, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    assert resolve_ir_dir(ov_ir_dir) == ov_ir_dir.resolve()


def test_concurrent_starts_convert_once(servehall_tiny_llama: Path, tmp_path: Path) -> None:
    """Two processes ask for the same model at once: one converts (and logs it),
    the other waits on the lock and reuses the result; no temporary directory remains."""
    cache = tmp_path / "cache"
    code = (
        "import logging, sys; from pathlib import Path; "
        "logging.basicConfig(level=logging.INFO); "
        "from servehall_openvino_cpu.convert import resolve_ir_dir; "
        "print(resolve_ir_dir(Path(sys.argv[1]), cache_dir=Path(sys.argv[2])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(servehall_tiny_llama), str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    (path,) = paths
    assert is_ir_dir(Path(path)) and (Path(path) / MARKER).is_file()
    converted = sum("converted" in err for _, err in results)
    assert converted == 1, [err[-500:] for _, err in results]
    assert [p.name for p in cache.iterdir() if ".build-" in p.name] == []
