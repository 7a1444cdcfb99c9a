"""Tests of servehall.engines.conversion (the conversion cache key and the converter
runner; the atomic build itself is in test_cache.py): the key is read from a
stored digest while path, sizes and mtimes agree (no byte of the model is read), the
content is hashed again when they change; a converter dies with its parent; a full
disk is one clear error and leaves no half-written cache entry.

ENOSPC here is the kernel's own: writes to ``/dev/full`` (always available), and a
1 MiB tmpfs where this test may mount one (root); nothing is injected."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servehall.engines import conversion
from servehall.engines.cache import DiskFullError, build_atomically
from servehall.engines.conversion import (
    _last_line,
    content_digest,
    run_converter,
    source_digest,
    stat_fingerprint,
    stored_content_digest,
)
from servehall.errors import EngineError


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "sub" / "tokenizer.json").write_text("{}")
    (d / ".cache").mkdir()
    (d / ".cache" / "ignored").write_text("x")
    return d


def test_key_is_read_from_the_index_while_the_stat_agrees(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = tmp_path / "index"
    digest, hashed = stored_content_digest(model, index)
    assert hashed
    reads: list[Path] = []
    real = conversion.content_digest
    monkeypatch.setattr(conversion, "content_digest", lambda p: reads.append(p) or real(p))
    # unchanged: no content read at all
    again, hashed = stored_content_digest(model, index)
    assert (again, hashed, reads) == (digest, False, [])
    key = source_digest(model, ["v1"], index_dir=index)
    assert key != source_digest(model, ["v2"], index_dir=index) and reads == []
    # same size, new mtime (touched, content unchanged): hashed again, same digest
    st = (model / "model.safetensors").stat()
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert stored_content_digest(model, index) == (digest, True) and len(reads) == 1
    # changed content of the same size, with a new mtime: a new digest
    (model / "model.safetensors").write_bytes(os.urandom(4096))
    changed, hashed = stored_content_digest(model, index)
    assert hashed and changed != digest
    # a new file, a removed file: hashed again
    (model / "extra.bin").write_bytes(b"1")
    assert stored_content_digest(model, index)[1]
    (model / "extra.bin").unlink()
    assert stored_content_digest(model, index) == (changed, True)
    # hidden files never count
    (model / ".cache" / "ignored").write_text("changed")
    assert stored_content_digest(model, index) == (changed, False)


def test_same_content_elsewhere_gives_the_same_key(model: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    index = tmp_path / "index"
    assert source_digest(model, [1], index_dir=index) == source_digest(copy, [1], index_dir=index)


def test_unwritable_index_only_costs_a_rehash(model: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert stored_content_digest(model, blocker)[1]
    assert stored_content_digest(model, blocker)[1]


def test_converter_that_fills_the_disk_is_one_error(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m-key"
    writer = "open('/dev/full', 'wb', buffering=0).write(b'x' * 65536)"

    def build(tmp: Path) -> None:
        run_converter(
            [sys.executable, "-c", writer], tmp / ".log", label="t", what="converting m", quiet=True
        )

    with pytest.raises(DiskFullError, match="converting m failed: the disk is full"):
        build_atomically(target, build, is_ready=lambda d: (d / "x").is_file())
    assert [p.name for p in target.parent.iterdir()] == [".m-key.lock"]


def test_converter_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent that runs a converter is SIGKILLed: the converter is killed too."""
    pidfile = tmp_path / "child.pid"
    child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = (
        "import sys; from pathlib import Path; "
        "from servehall.engines.conversion import run_converter; "
        f"run_converter([sys.executable, '-c', {child!r}], Path({str(tmp_path / 'c.log')!r}), "
        "label='t', what='t', quiet=True)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"converter {pid} outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_fingerprint_reads_no_content_but_sees_stat_changes(model: Path, tmp_path: Path) -> None:
    fp = stat_fingerprint(model)
    digest = content_digest(model)
    f = model / "model.safetensors"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[0] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    assert stat_fingerprint(model) == fp  # only stats are read
    assert content_digest(model) != digest  # the content digest sees the bytes
    import shutil

    shutil.copytree(model, tmp_path / "elsewhere")
    assert stat_fingerprint(tmp_path / "elsewhere") != fp  # the path is part of it


def test_content_digest_covers_names_and_skips_hidden_files(model: Path) -> None:
    digest = content_digest(model)
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref")
    assert content_digest(model) == digest
    (model / "sub" / "tokenizer.json").rename(model / "sub" / "tokenizer2.json")
    assert content_digest(model) != digest


def test_salt_is_json_normalised(model: Path, tmp_path: Path) -> None:
    index = tmp_path / "index"
    a = source_digest(model, {"b": 1, "a": [1, 2]}, index_dir=index)
    assert a == source_digest(model, {"a": [1, 2], "b": 1}, index_dir=index)
    assert a != source_digest(model, {"a": [2, 1], "b": 1}, index_dir=index)


def test_failed_converter_is_one_engine_error_with_its_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    script = "import sys; print('x' * 3000); print('bad weights', file=sys.stderr); sys.exit(3)"
    with pytest.raises(EngineError) as err:
        run_converter([sys.executable, "-c", script], log, label="t", what="converting m")
    msg = str(err.value)
    assert msg.startswith("converting m failed (exit 3): ") and msg.endswith("bad weights\n")
    assert len(msg) < 2100  # the tail only
    assert not isinstance(err.value, DiskFullError)
    assert not log.exists()


def test_converter_runs_offline_and_success_removes_the_log(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    script = (
        f"import os; open({str(out)!r}, 'w').write(os.environ['HF_HUB_OFFLINE'] + "
        "os.environ['TRANSFORMERS_OFFLINE'])"
    )
    run_converter(
        [sys.executable, "-c", script], tmp_path / "c.log", label="t", what="t", quiet=True
    )
    assert out.read_text() == "11" and not (tmp_path / "c.log").exists()


def test_last_line(tmp_path: Path) -> None:
    f = tmp_path / "log"
    assert _last_line(f) == ""
    f.write_text("first\n  progress 10%\r  progress 20%  \n\n")
    assert _last_line(f) == "progress 20%"
    f.write_text("y" * 300)
    assert _last_line(f) == "y" * 200
