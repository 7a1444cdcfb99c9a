"""server/serve.py: Hypercorn settings from config; host/versions.py: startup refusals
(no engine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.config.settings import Settings
from servehall.errors import ConfigError
from servehall.host.versions import build_host
from servehall.plugin.manager import PluginHost
from servehall.server.serve import hypercorn_config, serve


def test_hypercorn_defaults_raised_for_streaming(tmp_path: Path) -> None:
    from hypercorn.config import Config

    s = Settings(
        server={
            "bind": ["127.0.0.1:9", "[::1]:10"],
            "graceful_timeout_s": 90,
            "keep_alive_max_requests": 5000,
        }
    )
    cfg = hypercorn_config(s)
    default = Config()
    assert cfg.bind == ["127.0.0.1:9", "[::1]:10"]
    assert cfg.graceful_timeout == 90 > default.graceful_timeout
    assert cfg.keep_alive_max_requests == 5000 > default.keep_alive_max_requests
    assert cfg.alpn_protocols == ["h2", "http/1.1"]
    assert not cfg.ssl_enabled


def test_early_response_drain_budget_reaches_hypercorn() -> None:
    from servehall.server.hypercorn import h1_early_response

    s = Settings(server={"early_response_drain_bytes": 1000, "early_response_drain_s": 2.5})
    cfg = hypercorn_config(s)
    assert getattr(cfg, h1_early_response.DRAIN_BYTES_ATTR) == 1000
    assert getattr(cfg, h1_early_response.DRAIN_S_ATTR) == 2.5
    default = hypercorn_config(Settings())
    assert getattr(default, h1_early_response.DRAIN_BYTES_ATTR) == (
        h1_early_response.DEFAULT_DRAIN_BYTES
    )


def test_tls_needs_both_files(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ConfigError):
        hypercorn_config(Settings(server={"certfile": str(tmp_path / "c.pem")}))


async def test_build_host_refusals(tmp_path: Path) -> None:
    plugins = PluginHost([])
    with pytest.raises(ConfigError, match="no \\[\\[models\\]\\]"):
        await build_host(Settings(sinks=[]), plugins)
    missing = Settings(sinks=[], models=[{"name": "m", "path": str(tmp_path / "nope")}])
    with pytest.raises(ConfigError, match="does not exist"):
        await build_host(missing, plugins)
    no_tok = Settings(sinks=[], models=[{"name": "m", "path": str(tmp_path), "backend": "cpu"}])
    with pytest.raises(ConfigError, match="tokenizer"):
        await build_host(no_tok, plugins)


def test_bad_bind_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("sinks = []\n")
    with pytest.raises(ConfigError, match="host:port"):
        serve(cfg, bind=["nohostport"])


def test_freeze_startup_heap_moves_live_objects_to_the_permanent_generation() -> None:
    import gc
    import weakref

    from servehall.server.serve import freeze_startup_heap

    class Node:
        other: object = None

    assert gc.get_freeze_count() == 0
    kept = [[i] for i in range(1000)]  # tracked containers alive at "startup"
    a, b = Node(), Node()
    a.other, b.other = b, a  # startup garbage: a cycle only the collector frees
    gone = weakref.ref(a)
    del a, b
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(kept)
        assert gone() is None  # collected first, not frozen
    finally:
        gc.unfreeze()
