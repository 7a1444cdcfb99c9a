"""The conversion cache (engines/conversion.py, engines/cache.py): the key is read from a
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
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.engines import conversion
from servehall.engines.cache import DiskFullError, build_atomically
from servehall.engines.conversion import run_converter, source_digest, stored_content_digest


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


def test_enospc_in_a_build_is_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m-key"

    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "weights.bin").symlink_to("/dev/full")  # the kernel answers ENOSPC
        with open(tmp / "weights.bin", "wb", buffering=0) as fh:
            fh.write(b"\0" * 65536)

    with pytest.raises(DiskFullError, match=r"disk is full \(No space left on device; -?\d+ MiB"):
        build_atomically(target, build, is_ready=lambda d: (d / "config.json").is_file())
    assert sorted(p.name for p in target.parent.iterdir()) == [".m-key.lock"]


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


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs the right to mount: root in a container that allows it)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_build_on_a_full_small_disk(small_fs: Path) -> None:
    target = small_fs / "m-key"

    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "weights.bin").write_bytes(b"\0" * (2 << 20))  # 2 MiB into 1 MiB

    with pytest.raises(DiskFullError, match=r"MiB free on"):
        build_atomically(target, build, is_ready=lambda d: (d / "config.json").is_file())
    assert [p.name for p in small_fs.iterdir()] == [".m-key.lock"]
    # the space is back: a build that fits succeeds
    build_atomically(
        target, lambda t: (t / "config.json").write_text("{}"), is_ready=lambda d: False
    )
    assert (target / "config.json").is_file()


def test_stale_build_dirs_of_a_killed_builder_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "m-key"
    stale = tmp_path / ".m-key.build-dead"
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"x")
    build_atomically(target, lambda t: (t / "ok").write_text("1"), is_ready=lambda d: False)
    assert not stale.exists() and (target / "ok").is_file()


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
