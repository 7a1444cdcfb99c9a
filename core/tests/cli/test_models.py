"""Tests of servehall.cli.models (``servehall models pull|verify|ls|push``) in-process
with Typer's runner, against a real static HTTP mirror and a real cache directory."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servehall.cli.models import models_app
from servehall.sources.manifest import MANIFEST_NAME, build_manifest


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    """A mirror serving model ``m`` (two files and its manifest); its base URL."""
    root = tmp_path / "site"
    model = root / "m"
    (model / "weights").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "weights" / "w.bin").write_bytes(b"w" * 20_000)
    (model / MANIFEST_NAME).write_bytes(build_manifest(model).raw)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def config(tmp_path: Path, mirror: str) -> Path:
    cfg = tmp_path / "servehall.toml"
    cfg.write_text(
        f'[model_store]\ncache_dir = "{tmp_path / "cache"}"\n\n'
        f'[[models]]\nname = "tiny"\npath = "{mirror}/m"\nbackend = "null"\n'
    )
    return cfg


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(models_app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_pull_by_name_or_url_prints_the_cached_directory(
    config: Path, mirror: str, tmp_path: Path
) -> None:
    code, out, _ = _run("pull", "tiny", "--config", str(config))
    assert code == 0
    path = Path(out.strip())
    assert path.parent == tmp_path / "cache" and (path / "weights" / "w.bin").is_file()
    code, out2, _ = _run("pull", f"{mirror}/m", "--config", str(config))
    assert code == 0 and out2 == out


def test_unknown_source_lists_the_url_models(config: Path) -> None:
    code, _, err = _run("pull", "nope", "--config", str(config))
    assert code == 2
    flat = " ".join(err.replace("│", " ").split())
    assert "'nope' is neither a URL nor a [[models]] name with a URL path (those: tiny)" in flat


def test_verify_names_each_bad_file(config: Path, mirror: str) -> None:
    code, out, err = _run("verify", "tiny", "--config", str(config))
    assert code == 1 and "not in the cache" in err
    _, pulled, _ = _run("pull", "tiny", "--config", str(config))
    path = Path(pulled.strip())
    code, out, _ = _run("verify", "tiny", "--config", str(config))
    assert code == 0 and out.strip() == f"{path}: 2 files OK"
    (path / "weights" / "w.bin").write_bytes(b"x" * 20_000)
    (path / "config.json").unlink()
    code, out, err = _run("verify", str(path))  # a directory with a manifest: no config
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{path}: ") for line in lines)
    assert any("config.json" in line for line in lines)
    assert any("weights/w.bin" in line for line in lines)


def test_verify_a_directory_without_manifest(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    code, _, err = _run("verify", str(tmp_path / "d"))
    assert code == 1 and f"{MANIFEST_NAME}: No such file or directory" in err


def test_ls_lists_the_cache(config: Path, tmp_path: Path) -> None:
    code, out, _ = _run("ls", "--json", "--config", str(config))
    assert code == 0 and json.loads(out) == []
    _run("pull", "tiny", "--config", str(config))
    code, out, _ = _run("ls", "--json", "--config", str(config))
    [row] = json.loads(out)
    assert row["bytes"] == 20_000 + len('{"a": 1}') and row["in_use"] is False
    assert row["source"].endswith("/m") and Path(row["path"]).parent == tmp_path / "cache"
    code, out, _ = _run("ls", "--config", str(config))
    assert code == 0 and row["key"][:8] in out and "no limit" in out


def test_push_refuses_a_non_s3_url(config: Path, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a").write_text("x")
    code, _, err = _run("push", str(tmp_path / "model"), "ftp://x/y", "--config", str(config))
    assert code == 2 and "ftp://x/y" in " ".join(err.replace("│", " ").split())
