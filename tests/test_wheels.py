"""Case P01: servehall works installed from wheels, not only from a checkout.

Builds a wheel of every workspace member and of the example plugin
(``pip wheel --no-deps``), installs them — not editable — into a fresh virtual
environment in an empty temporary directory, and drives the installed ``servehall``
console script: ``db upgrade``, ``plugins``, ``keys create``, ``serve --demo`` with the
auth and example plugins enabled, one authenticated request whose record lands in the
example's ``webhook_delivery`` table (posted to a local webhook that fails once, so the
retry runs), and ``audit verify``. Bad input: a plugin whose migration branch is
missing stops ``db upgrade`` and ``serve`` with one line naming it.

The wheels are installed the way a user installs them — ``pip install`` resolving every
declared dependency (``servehall[torch]`` for ``serve --demo``'s CPU engine) — except that
nothing is downloaded again (torch, transformers … are gigabytes): the fresh environment
sees, through a ``.pth`` file, a directory of links to exactly the distributions the
wheels' declared requirements reach (their transitive closure in this environment,
markers and extras evaluated), so pip finds them installed and resolves against them
(``--no-index``: a declared requirement this environment cannot satisfy fails the
install), and a module a member imports without declaring it is missing at run time.
The one documented manual step, ``pip install --no-deps optimum-intel`` (the OpenVINO
exporter, deliberately undeclared), is mirrored by linking it and what it needs.
No ``servehall*`` distribution is linked, so every servehall module the CLI runs comes
from the wheels (the test asserts that).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.conftest import free_port, start_server

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = [
    ROOT / "core",
    *sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file()),
    ROOT / "examples" / "webhook_sink",
]
PEPPER = "wheel-test-pepper-0123456789"
EXTRAS = {"servehall": {"torch"}}
"""Extras the test installs (``serve --demo`` runs on the core's torch CPU engine)."""

pytestmark = pytest.mark.slow


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []
    fail_next: ClassVar[int] = 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if type(self).fail_next > 0:
            type(self).fail_next -= 1
            self.send_response(503)
            self.end_headers()
            return
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    _Hook.received = []
    _Hook.fail_next = 1
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with every member installed from its wheel; returns its bin dir."""
    root = tmp_path_factory.mktemp("wheels")
    wheelhouse = root / "wheelhouse"
    # build from clean copies: setuptools writes build/ and *.egg-info next to the sources
    skip = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests")
    sources = [root / "src" / m.name for m in MEMBERS]
    for member, copy in zip(MEMBERS, sources, strict=True):
        shutil.copytree(member, copy, ignore=skip)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheelhouse), *map(str, sources)],
        capture_output=True, text=True, cwd=root, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = sorted(wheelhouse.glob("*.whl"))
    assert len(wheels) == len(MEMBERS), wheels
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    vsite = Path(
        subprocess.check_output(
            [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    # only the third-party distributions the members' declared requirements reach
    own = {_wheel_project(w): _wheel_requires(w) for w in wheels}
    needed = _closure([(n, EXTRAS.get(n, set())) for n in own], own)
    # and what plugins/openvino_cpu/README.md tells users to add by hand, since
    # optimum-intel is deliberately not declared (`pip install --no-deps optimum-intel`):
    # `serve --demo` converts the demo model with it
    needed |= _closure([("optimum-intel", set())], {})
    deps = root / "deps"
    deps.mkdir()
    for name in sorted(needed):
        if not name.startswith("servehall"):
            _link_distribution(metadata.distribution(name), deps)
    (vsite / "zz_servehall_test_deps.pth").write_text(str(deps) + "\n")
    specs = [
        f"{w}[{','.join(sorted(EXTRAS[n]))}]" if (n := _wheel_project(w)) in EXTRAS else str(w)
        for w in wheels
    ]
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-index",
         "--find-links", str(wheelhouse), *specs],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert inst.returncode == 0, inst.stderr[-3000:]
    where = subprocess.check_output(
        [str(vpy), "-c",
         "import servehall, servehall_auth, servehall_webhook_sink, servehall.migrations as m;"
         "print(servehall.__file__); print(servehall_auth.__file__); print(m.__path__[0])"],
        text=True,
    ).split()  # fmt: skip
    for path in where:
        assert path.startswith(str(vsite)), where  # from the wheels, not the checkout
    assert (Path(where[2]) / "versions" / "0001_base.py").is_file()
    return venv / "bin"


def _wheel_project(wheel: Path) -> str:
    """A wheel file's project name, normalized (``servehall_auth-1.0-…`` → ``servehall-auth``)."""
    return wheel.name.split("-")[0].replace("_", "-").lower()


def _wheel_requires(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA (what the wheel declares)."""
    from email.parser import Parser

    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    return list(meta.get_all("Requires-Dist") or [])


def _closure(roots: list[tuple[str, set[str]]], own: Mapping[str, list[str]]) -> set[str]:
    """Normalized names of the distributions ``roots`` (name, extras) require, recursively,
    as installed in this environment (markers evaluated with the requested extras); the
    requirements of the names in ``own`` (the built wheels) come from ``own``. A
    requirement not installed here is kept out: pip then reports it."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, set[str]] = {}
    todo = [(canonicalize_name(n), set(e)) for n, e in roots]
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        if name in own:
            requires = own[name]
        else:
            try:
                requires = metadata.distribution(name).requires or []
            except metadata.PackageNotFoundError:
                continue
        for text in requires:
            req = Requirement(text)
            envs = [{"extra": e} for e in sorted(seen[name])] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    return {n for n in seen if _installed(n)}


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def _link_distribution(dist: metadata.Distribution, into: Path) -> None:
    """Symlink the top-level entries of ``dist``'s installed files (its packages, modules,
    .libs and .dist-info) into ``into``."""
    base = Path(str(dist.locate_file("")))
    for top in {Path(str(f)).parts[0] for f in dist.files or []}:
        src = base / top
        dst = into / top
        if top in ("..", "__pycache__") or top.endswith(".pth") or dst.exists():
            continue
        if src.exists():
            dst.symlink_to(src)


def _config(work: Path, port: int, hook_url: str, *, enabled: list[str]) -> Path:
    cfg = work / "deploy.toml"
    cfg.write_text(
        f"""
[plugins]
enabled = {json.dumps(enabled)}
[server]
bind = ["127.0.0.1:{port}"]
[database]
url = "sqlite+aiosqlite:///{work / "servehall.db"}"
[auth]
pepper = "{PEPPER}"
[[sinks]]
name = "sql"
[[sinks]]
name = "webhook"
[webhook_sink]
url = "{hook_url}"
max_attempts = 3
backoff_s = 0.05
"""
    )
    return cfg


def _run(bin_dir: Path, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEHALL_CONFIG")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [str(bin_dir / "servehall"), *args], capture_output=True, text=True, cwd=work,
        env=env, timeout=300,
    )  # fmt: skip


def test_p01_installed_wheels_serve_with_auth_and_example_plugin(
    installed: Path, tmp_path: Path, webhook: str
) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    port = free_port()
    cfg = _config(work, port, webhook, enabled=["auth", "webhook_sink"])

    up = _run(installed, work, "db", "upgrade", "--config", str(cfg))
    assert up.returncode == 0, up.stderr
    assert "the schema is up to date" in up.stdout, up.stdout
    assert "auth_0003_key_priority" in up.stdout and "webhook_sink_0001" in up.stdout

    listed = _run(installed, work, "plugins", "--json", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    for name, dist in [("auth", "servehall-auth"), ("webhook_sink", "servehall-webhook-sink")]:
        assert plugins[name]["enabled"] and plugins[name]["loaded"], plugins[name]
        assert plugins[name]["distribution"] == dist and plugins[name]["error"] is None
    assert "servehall_migrations" in plugins["webhook_sink"]["hooks"]

    key = _run(installed, work, "keys", "create", "--tenant", "acme", "--config", str(cfg))
    assert key.returncode == 0, key.stderr
    secret = key.stdout.strip().splitlines()[-1]
    assert secret.startswith("sh-")

    env = {"PATH": f"{installed}{os.pathsep}{os.environ.get('PATH', '')}"}
    text = cfg.read_text()
    server = start_server(
        text, work / "srv", env=env, extra_args=["--demo"], name="wheels",
        command=[str(installed / "servehall")],
    )  # fmt: skip
    with server, httpx.Client(base_url=server.base_url, timeout=60) as c:
        denied = c.post("/v1/chat/completions", json={"model": "demo", "messages": []})
        assert denied.status_code == 401
        r = c.post(
            "/v1/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": "demo", "max_tokens": 4,
                  "messages": [{"role": "user", "content": "hello"}]},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        request_id = r.json()["id"]
    # SIGTERM flushed the record sinks
    db = sqlite3.connect(work / "servehall.db")
    rows = db.execute(
        "SELECT delivered, attempts, status_code FROM webhook_delivery WHERE request_id = ?",
        (request_id,),
    ).fetchall()
    assert rows and rows[0][0] == 1 and rows[0][2] == 204, rows
    # the webhook answered 503 to the very first POST: that record was retried, delivered
    everything = db.execute("SELECT delivered, attempts FROM webhook_delivery").fetchall()
    assert all(d == 1 for d, _ in everything) and max(a for _, a in everything) == 2
    assert any(rec["request_id"] == request_id for rec in _Hook.received)
    tenant = db.execute(
        "SELECT tenant FROM request_log WHERE request_id = ?", (request_id,)
    ).fetchone()
    assert tenant == ("acme",)
    db.close()

    verify = _run(installed, work, "audit", "verify", "--config", str(cfg))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("OK:")


def test_installed_plugin_with_missing_branch_is_one_line(
    installed: Path, tmp_path: Path, webhook: str
) -> None:
    vsite = next(installed.parent.glob("lib/python*/site-packages"))
    versions = vsite / "servehall_webhook_sink" / "migrations" / "versions"
    hidden = tmp_path / "hidden"
    shutil.move(str(versions), str(hidden))
    try:
        work = tmp_path / "w"
        work.mkdir()
        cfg = _config(work, free_port(), webhook, enabled=["auth", "webhook_sink"])
        for args in (["db", "upgrade"], ["serve", "--demo"]):
            out = _run(installed, work, *args, "--config", str(cfg))
            assert out.returncode == 2, out.stdout + out.stderr
            # one error line (timestamped INFO log lines such as --demo's may come first)
            lines = [ln for ln in out.stderr.strip().splitlines() if " INFO " not in ln]
            assert len(lines) == 1 and "plugin 'webhook_sink'" in lines[0], out.stderr
            assert "Traceback" not in out.stderr
            assert "migration branch 'webhook_sink' is missing" in lines[0]
    finally:
        shutil.move(str(hidden), str(versions))
