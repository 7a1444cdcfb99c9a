"""Shared end-to-end fixtures: the demo model and real ``servehall serve`` subprocesses.

Fixtures
--------

``demo_model_dir`` (session)
    A :class:`pathlib.Path` to the demo model, built once per test session with
    ``servehall.demo.build_demo_model`` in the session's ``$SERVEHALL_CACHE_DIR`` (a
    temporary directory set by the root ``conftest.py``; never ``~/.cache``), or reused
    from ``$SERVEHALL_TEST_DEMO_DIR`` when that variable names a directory.

``servehall_server`` (session; a factory)
    ``servehall_server(config, *, env=None, ready_timeout=180.0, name="server",
    extra_args=()) -> ServerHandle`` writes ``config`` (a dict, dumped as TOML, or TOML
    text) to a file, starts ``servehall serve --config FILE --bind 127.0.0.1:PORT`` as a
    real subprocess (Hypercorn) on a free port, waits until ``GET /health/ready`` answers
    200, and returns a :class:`ServerHandle` with ``base_url``, ``port``, ``process``,
    ``log_path``, ``config_path`` and ``log_text()``. The handle is a context manager;
    ``stop()`` sends SIGTERM (then SIGKILL after 15 s). Servers still running at the end
    of the session are stopped. If the server exits or is not ready in time, the factory
    raises ``RuntimeError`` with the tail of the server log.

    A TLS config (``server.certfile``/``keyfile``) is probed over ``https`` (without
    certificate verification); ``base_url`` then starts with ``https://``.

``run_cli(config, *args, env=None, cwd=None)`` (plain helper)
    Runs ``servehall ARGS --config CONFIG`` as a subprocess and returns the
    ``CompletedProcess`` (text output, no check of the exit code).

``demo_config(model_dir, **sections)`` (plain helper; also the fixture
``demo_config_factory``)
    A config dict serving ``model_dir`` as model ``"demo"`` with ``backend = "auto"``,
    the ``openvino_cpu`` plugin enabled (so ``auto`` selects it over the torch ``cpu``
    backend) and ``options.inference_precision = "f32"``, and no record sinks. Keyword
    arguments merge extra sections (e.g. ``scheduler={"max_concurrency": 2}``);
    ``plugins={"enabled": [...]}`` adds to the enabled list (``openvino_cpu`` stays).

``hold_stream(port, body)`` / ``stream_then_drop(port, body)`` (plain helpers)
    A streamed request over a raw HTTP/1.1 socket, read to its first SSE event: kept
    open (the caller closes it later, a client disconnect) or closed at once.

``haproxy_binary()`` / ``run_haproxy(binary, a, b, a_agent, b_agent, log_path)``
    HAProxy running ``deploy/haproxy.cfg`` as is in front of two replicas (a context
    manager yielding its URL once ``/health/ready`` answers 200 through it).

Typical use, one server per module::

    @pytest.fixture(scope="module")
    def server(servehall_server, demo_model_dir):
        with servehall_server(demo_config(demo_model_dir)) as srv:
            yield srv

    def test_models(server):
        r = httpx.get(server.base_url + "/v1/models")
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.testing.cli import run_cli as run_cli  # re-exported for the e2e modules
from servehall.testing.cli import servehall_cmd, stop_process
from servehall.testing.sockets import free_port

# --- TOML writing (tomli-w) -------------------------------------------------------------


def _plain(v: Any) -> Any:
    """``v`` with paths as strings and tuples as lists (what ``tomli_w`` writes)."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def dump_toml(data: Mapping[str, Any]) -> str:
    """Write a config dict as TOML with ``tomli_w`` (any Unicode, nested tables, arrays
    of tables). Raises TypeError for a value TOML cannot hold (None)."""
    import tomli_w

    return tomli_w.dumps(_plain(data))


def demo_config(model_dir: Path | str, **sections: Any) -> dict[str, Any]:
    """A config serving ``model_dir`` as model ``demo`` on the auto-selected backend (f32),
    with the settings ``serve --demo`` gives it (:data:`servehall.demo.DEMO_MODEL_SETTINGS`:
    a lazy tool-call grammar under ``tool_choice: "auto"``)."""
    from servehall.demo import DEMO_MODEL_SETTINGS

    cfg: dict[str, Any] = {
        "models": [
            {
                "name": "demo",
                "path": str(model_dir),
                "backend": "auto",
                "options": {"inference_precision": "f32"},
                **DEMO_MODEL_SETTINGS,
            }
        ],
        "sinks": [],
        "plugins": {"enabled": ["openvino_cpu"]},
    }
    for name, value in sections.items():
        if name == "plugins" and isinstance(value, Mapping) and "enabled" in value:
            enabled = list(value["enabled"])
            enabled += [p for p in cfg["plugins"]["enabled"] if p not in enabled]
            cfg["plugins"] = {**cfg["plugins"], **value, "enabled": enabled}
        elif isinstance(value, Mapping) and isinstance(cfg.get(name), Mapping):
            cfg[name] = {**cfg[name], **value}
        else:
            cfg[name] = value
    return cfg


def sql_records(work: Path, linger_s: float = 0.01) -> tuple[str, dict[str, Any]]:
    """A SQLite records database in ``work``: ``(url, sections)`` where ``sections``
    (``database`` with ``auto_migrate``, the ``sql`` sink lingering ``linger_s``) are
    keyword arguments of :func:`demo_config`."""
    url = f"sqlite+aiosqlite:///{work / 'records.db'}"
    return url, {
        "database": {"url": url, "auto_migrate": True},
        "sinks": [{"name": "sql", "options": {"linger_s": linger_s}}],
    }


def keyed_demo_config(
    work: Path, model_dir: Path, pepper_env: str, pepper: str, **sections: Any
) -> tuple[Path, Callable[..., str], Path]:
    """A migrated demo deployment with the auth plugin in ``work``: ``(config file, cli,
    SQLite file)``. ``cli(*args)`` runs ``servehall`` on that config (with ``pepper`` in
    ``pepper_env``) and returns its stdout, failing the test on a non-zero exit;
    ``sections`` are further :func:`demo_config` sections."""
    db = work / "servehall.db"
    cfg = demo_config(
        model_dir,
        plugins={"enabled": ["auth"]},
        database={"url": f"sqlite+aiosqlite:///{db}"},
        sinks=[{"name": "sql", "options": {"linger_s": 0.05}}],
        auth={"pepper": {"env": pepper_env}, "key_cache_ttl_s": 0},
        **sections,
    )
    config = work / "servehall.toml"
    config.write_text(dump_toml(cfg))

    def cli(*args: str) -> str:
        proc = run_cli(config, *args, env={pepper_env: pepper}, cwd=work)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    cli("db", "upgrade")
    return config, cli, db


def create_keys(cli: Callable[..., str], **scopes: Sequence[str]) -> dict[str, str]:
    """One API key per tenant name (``alice=()`` for the default scopes, ``ops=("admin",)``
    for those scopes only), made with ``servehall keys create``: ``{name: key}``."""
    return {
        name: json.loads(
            cli("keys", "create", "--tenant", name, "--json", *(["--scopes", *s] if s else []))
        )["key"]
        for name, s in scopes.items()
    }


class KeyedServer:
    """A running server with the auth plugin, its SQLite file and named principals' keys:
    clients (``http``, ``openai``) per principal and plain SQL on the records (``rows``)."""

    def __init__(
        self,
        server: ServerHandle,
        db: Path,
        keys: dict[str, str],
        config: Path,
        timeout: float = 60,
    ) -> None:
        self.server = server
        self.db = db
        self.keys = keys
        self.config = config
        self.timeout = timeout

    def http(self, who: str) -> httpx.Client:
        """An HTTP/2 client with ``who``'s key."""
        return httpx.Client(
            base_url=self.server.base_url,
            http1=False,
            http2=True,
            timeout=self.timeout,
            headers={"Authorization": f"Bearer {self.keys[who]}"},
        )

    def openai(self, who: str) -> Any:
        """The official ``openai`` client with ``who``'s key (no retries)."""
        import openai

        return openai.OpenAI(
            base_url=self.server.base_url + "/v1", api_key=self.keys[who], max_retries=0
        )

    def rows(self, sql: str, *args: Any) -> list[Any]:
        """The rows of one SQL statement on the server's SQLite file."""
        import sqlite3

        with sqlite3.connect(self.db) as db:
            return db.execute(sql, args).fetchall()


# --- servers ---------------------------------------------------------------------------


class ServerHandle:
    """A running ``servehall serve`` subprocess (see the module docstring)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        base_url: str,
        port: int,
        log_path: Path,
        config_path: Path,
    ) -> None:
        self.process = process
        self.base_url = base_url
        self.port = port
        self.log_path = log_path
        self.config_path = config_path

    def log_text(self) -> str:
        """Everything the server wrote to stdout/stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        return stop_process(self.process, timeout, kill_wait=5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_serve_cmd = servehall_cmd


def start_server(
    config: Mapping[str, Any] | str,
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 180.0,
    name: str = "server",
    extra_args: Sequence[str] = (),
    command: Sequence[str] | None = None,
) -> ServerHandle:
    """Start ``servehall serve`` and wait for ``/health/ready`` (see module docstring).

    ``command`` replaces the ``servehall`` invocation (e.g. an installed console script)."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else dump_toml(config)
    config_path = workdir / f"{name}.toml"
    config_path.write_text(text)
    log_path = workdir / f"{name}.log"
    port = free_port()
    tls = "certfile" in text
    scheme = "https" if tls else "http"
    base_url = f"{scheme}://127.0.0.1:{port}"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("SERVEHALL_CONFIG", None)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *(command or _serve_cmd()),
                "serve",
                "--config",
                str(config_path),
                "--bind",
                f"127.0.0.1:{port}",
                *extra_args,
            ],
            cwd=workdir,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    handle = ServerHandle(process, base_url, port, log_path, config_path)
    deadline = time.monotonic() + ready_timeout
    last = ""
    with httpx.Client(verify=False, timeout=5.0) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"servehall serve exited with {process.returncode} before ready:\n"
                    + handle.log_text()[-4000:]
                )
            try:
                r = client.get(base_url + "/health/ready")
                if r.status_code == 200:
                    return handle
                last = f"{r.status_code} {r.text[:300]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                handle.stop()
                raise RuntimeError(
                    f"servehall serve not ready after {ready_timeout:g} s (last: {last}):\n"
                    + handle.log_text()[-4000:]
                )
            time.sleep(0.2)


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The demo model, built once per session (``$SERVEHALL_TEST_DEMO_DIR`` reuses one)."""
    preset = os.environ.get("SERVEHALL_TEST_DEMO_DIR")
    from servehall.demo import build_demo_model, default_demo_dir

    if preset:
        return Path(build_demo_model(Path(preset)))
    # the session's cache dir (the root conftest.py): one build shared with the plugin
    # tests and with `serve --demo` subprocesses
    return Path(build_demo_model(default_demo_dir()))


@pytest.fixture(scope="session")
def servehall_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerHandle]]:
    """Factory that starts real ``servehall serve`` subprocesses (module docstring)."""
    started: list[ServerHandle] = []
    root = tmp_path_factory.mktemp("servers")
    counter = iter(range(1_000_000))

    def factory(config: Mapping[str, Any] | str, **kw: Any) -> ServerHandle:
        name = kw.pop("name", "server")
        workdir = root / f"{name}-{next(counter)}"
        handle = start_server(config, workdir, name=name, **kw)
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        with contextlib.suppress(Exception):
            handle.stop()


@pytest.fixture(scope="session")
def demo_config_factory() -> Callable[..., dict[str, Any]]:
    """:func:`demo_config` as a fixture (for modules that prefer not to import conftest)."""
    return demo_config


def hold_stream(
    port: int, body: dict[str, Any], path: str = "/v1/completions", *, first_event: bool = True
) -> tuple[socket.socket, bytes]:
    """POST ``body`` (a streamed request) to ``path`` over a raw HTTP/1.1 socket and read
    until the first SSE event (not at all with ``first_event=False``: a request that will
    wait in a queue); return the open socket (the request keeps running until the caller
    closes it: a client disconnect) and what was read."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(
            b"POST %s HTTP/1.1\r\nHost: x\r\n" % path.encode()
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
            + data
        )
        got = b""
        while first_event and b"data: " not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
    except BaseException:
        s.close()
        raise
    return s, got


def stream_then_drop(port: int, body: dict[str, Any], path: str = "/v1/completions") -> bytes:
    """POST ``body`` to ``path`` over a raw HTTP/1.1 socket, read until the first SSE
    event, then close the socket (a client disconnect mid-stream).

    (A raw socket closes at once; an httpx client may keep the socket until later, and
    the kernel then accepts the server's writes as if the client were still there.)"""
    s, got = hold_stream(port, body, path)
    s.close()
    return got


# --- HAProxy ---------------------------------------------------------------------------

DEPLOY_DIR = Path(__file__).resolve().parents[1] / "deploy"


def haproxy_binary() -> str | None:
    """The ``haproxy`` executable (``.ci/services.d/haproxy.sh`` installs it), or None."""
    import shutil

    found = shutil.which("haproxy")
    return found or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").is_file() else None)


@contextlib.contextmanager
def run_haproxy(
    binary: str, a: str, b: str, a_agent: int, b_agent: int, log_path: Path
) -> Iterator[str]:
    """Run ``deploy/haproxy.cfg`` as is with replicas ``a``/``b`` (``host:port``) and their
    agent ports (a port nobody listens on leaves the configured weight: plain round
    robin); yield its base URL once it answers ``/health/ready`` with 200. Stopped
    (SIGTERM) on exit; the log (HAProxy's stdout/stderr) goes to ``log_path``."""
    port = free_port()
    env = {
        **os.environ,
        "HAPROXY_BIND": f"127.0.0.1:{port}",
        "SERVEHALL_A": a,
        "SERVEHALL_B": b,
        "SERVEHALL_A_AGENT_PORT": str(a_agent),
        "SERVEHALL_B_AGENT_PORT": str(b_agent),
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [binary, "-db", "-f", str(DEPLOY_DIR / "haproxy.cfg")], env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("haproxy did not come up:\n" + log_path.read_text())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
