"""``servehall serve`` startup refusals: one line on stderr, exit 2, no traceback.

Real CLI subprocesses (``servehall serve``) and, for the bind race, the real in-process
``run()`` with the demo model on the torch ``cpu`` backend.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.config.settings import Settings
from servehall.errors import ConfigError
from servehall.plugin.manager import PluginHost
from servehall.server.listeners import bind_sockets, check_binds
from servehall.server.serve import run
from tests.conftest import free_port, run_cli


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 held by a listening socket for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _config(tmp_path: Path, text: str = "sinks = []\n") -> Path:
    cfg = tmp_path / "servehall.toml"
    cfg.write_text(text)
    return cfg


def _assert_one_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == expected, stderr
    # nothing but the error line: no model loading, no "serving … on …" before it
    assert all("serving" not in line and "loading" not in line for line in lines), stderr


def test_serve_demo_port_in_use_fails_fast(tmp_path: Path, taken_port: int) -> None:
    started = time.monotonic()
    p = run_cli(
        _config(tmp_path),
        "serve",
        "--demo",
        "--bind",
        f"127.0.0.1:{taken_port}",
        cwd=tmp_path,
        env={},
    )
    assert p.returncode == 2, p.stderr
    _assert_one_line(p.stderr, f"error: cannot bind 127.0.0.1:{taken_port}: address already in use")
    assert time.monotonic() - started < 60  # no demo model build / engine start
    assert not (tmp_path / "servehall.db").exists()  # nothing started before the check


def test_serve_address_not_on_this_machine(tmp_path: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned to a local interface
    p = run_cli(
        _config(tmp_path), "serve", "--demo", "--bind", "192.0.2.1:8000", cwd=tmp_path, env={}
    )
    assert p.returncode == 2, p.stderr
    _assert_one_line(
        p.stderr, "error: cannot bind 192.0.2.1:8000: address not available on this machine"
    )


def test_serve_path_not_a_model_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = _config(tmp_path, f'sinks = []\n[[models]]\nname = "demo"\npath = "{empty}"\n')
    p = run_cli(cfg, "serve", "--bind", f"127.0.0.1:{free_port()}", cwd=tmp_path, env={})
    assert p.returncode == 2, p.stderr
    _assert_one_line(
        p.stderr,
        f"error: models.demo.path: {empty} is not a Hugging Face or OpenVINO model "
        "directory (no config.json / tokenizer files)",
    )


def test_bind_sockets_closes_earlier_sockets_on_failure(taken_port: int) -> None:
    first = free_port()
    with pytest.raises(ConfigError, match=f"cannot bind 127.0.0.1:{taken_port}: address already"):
        bind_sockets([f"127.0.0.1:{first}", f"127.0.0.1:{taken_port}"])
    check_binds([f"127.0.0.1:{first}"])  # the first one was released again
    with pytest.raises(ConfigError, match="is not host:port"):
        check_binds(["127.0.0.1"])


async def test_port_taken_after_the_check_fails_cleanly(
    demo_model_dir: Path, taken_port: int
) -> None:
    """The race: the port is taken while the models load. ``run()`` (which binds after
    the models are up) raises the same one-line ConfigError instead of a Hypercorn
    traceback, and shuts the engine down."""
    settings = Settings(
        sinks=[],
        server={"bind": [f"127.0.0.1:{taken_port}"]},
        models=[{"name": "demo", "path": str(demo_model_dir), "backend": "cpu"}],
    )
    with pytest.raises(ConfigError) as info:
        await run(settings, PluginHost([]))
    assert str(info.value) == f"cannot bind 127.0.0.1:{taken_port}: address already in use"
