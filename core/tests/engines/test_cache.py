"""Tests of servehall.engines.cache: cache directories built once, atomically, by
concurrent builders; a full disk is one clear error and leaves nothing behind.

ENOSPC here is the kernel's own: writes to ``/dev/full`` (always available), and a
1 MiB tmpfs where this test may mount one (root); nothing is injected."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.engines.cache import (
    DiskFullError,
    build_atomically,
    file_lock,
    installed_versions,
    servehall_cache_dir,
)


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


def _ready(d: Path) -> bool:
    return (d / "done").is_file()


def test_a_ready_target_is_not_rebuilt_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "t"
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "done").write_text(str(len(calls)))

    assert build_atomically(target, build, is_ready=_ready) == target
    build_atomically(target, build, is_ready=_ready)
    assert len(calls) == 1 and (target / "done").read_text() == "1"
    # the build dir is a hidden sibling, gone afterwards
    assert calls[0].parent == tmp_path and calls[0].name.startswith(".t.build-")
    assert not calls[0].exists()
    build_atomically(target, build, is_ready=_ready, force=True)
    assert (target / "done").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t.lock", "t"]  # old copy removed


def test_an_unready_target_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    (target / "half.bin").write_text("left by an old version")
    build_atomically(target, lambda t: (t / "done").write_text("x"), is_ready=_ready)
    assert sorted(p.name for p in target.iterdir()) == ["done"]


def test_a_failing_build_leaves_the_old_target_and_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "t"
    build_atomically(target, lambda t: (t / "done").write_text("old"), is_ready=_ready)

    def broken(tmp: Path) -> None:
        (tmp / "done").write_text("new")
        raise ValueError("converter refused")

    with pytest.raises(ValueError, match="converter refused"):
        build_atomically(target, broken, is_ready=_ready, force=True)
    assert (target / "done").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t.lock", "t"]


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "t"  # the parent is created
    builds: list[int] = []
    start = threading.Barrier(4)

    def build(tmp: Path) -> None:
        builds.append(1)
        time.sleep(0.1)
        (tmp / "done").write_text("x")

    def worker() -> None:
        start.wait()
        build_atomically(target, build, is_ready=_ready)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert builds == [1] and _ready(target)


def test_file_lock_excludes_other_processes(tmp_path: Path) -> None:
    """A child taking a plain ``flock`` on the same file waits until the block ends."""
    lock = tmp_path / "x.lock"
    code = (
        "import fcntl\n"
        f"fh = open({str(lock)!r}, 'a+b')\n"
        "fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n"
        "print('got', flush=True)\n"
    )
    with file_lock(lock):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        assert child.poll() is None  # waiting for the lock
    out, _ = child.communicate(timeout=30)
    assert out == "got\n" and child.returncode == 0


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEHALL_CACHE_DIR", str(tmp_path))
    assert servehall_cache_dir("ir") == tmp_path / "ir"
    assert not (tmp_path / "ir").exists()  # not created
    monkeypatch.setenv("SERVEHALL_CACHE_DIR", "")
    assert servehall_cache_dir("ir") == Path.home() / ".cache" / "servehall" / "ir"
    monkeypatch.delenv("SERVEHALL_CACHE_DIR")
    assert servehall_cache_dir("ir") == Path.home() / ".cache" / "servehall" / "ir"


def test_installed_versions_in_order() -> None:
    import pydantic

    got = installed_versions(["no-such-dist-servehall", "pydantic"])
    assert list(got) == ["no-such-dist-servehall", "pydantic"]
    assert got == {"no-such-dist-servehall": None, "pydantic": pydantic.VERSION}
