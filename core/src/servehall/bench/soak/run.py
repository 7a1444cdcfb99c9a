"""``servehall bench soak``: mixed concurrent traffic, optional faults, then the
invariants I1–I6 (:mod:`servehall.bench.soak.invariants`) checked after a clean stop.

The soak either starts the server itself (``servehall serve --demo`` or ``--config``,
in a work directory of its own, so that it can sample the server's RSS, inject faults
and stop it cleanly before counting rows) or is pointed at a running one (``--url``;
the database checks then need ``--config`` or ``--db-url`` and run without a stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from servehall.bench.soak.corpus import Shape, sdk_libraries
from servehall.bench.soak.faults import (
    DB_FAULTS,
    STOP_S,
    FaultError,
    FaultTargets,
    check_faults,
    pg_ctl_restart,
    postmaster_pid,
    redis_urls,
    run_shell,
    stop_processes,
)
from servehall.bench.soak.invariants import (
    FaultWindow,
    InvariantResult,
    LeftoverFile,
    Observation,
    Rejection,
    Row,
    check_audit,
    check_no_5xx,
    check_no_leftovers,
    check_one_row_each,
    check_rows_match,
    check_rss,
)
from servehall.bench.soak.mix import Mix
from servehall.errors import status_of_code
from servehall.testing.cli import servehall_cmd
from servehall.testing.sockets import free_port


class SoakError(Exception):
    """The soak cannot run (server does not start, bad option); one line for the user."""


@dataclass
class SoakOptions:
    """What to run (the CLI's options; see ``servehall bench soak --help``)."""

    duration_s: float = 120.0
    clients: int = 8
    url: str | None = None
    config: Path | None = None
    demo: bool = True
    api_key: str | None = None
    model: str = "demo"
    max_tokens: int = 8
    seed: int = 0
    schemas: int = 150
    faults: tuple[str, ...] = ()
    fault_interval_s: float | None = None
    fault_stop_s: float = STOP_S
    db_pid: int | None = None
    db_restart_cmd: str | None = None
    redis_restart_cmd: str | None = None
    db_url: str | None = None
    workdir: Path | None = None
    pids: tuple[int, ...] = ()
    rss_bound_mib: float = 512.0
    request_timeout_s: float = 60.0
    ready_timeout_s: float = 300.0
    output_json: Path | None = None


# --- the server ------------------------------------------------------------------------


@dataclass
class Server:
    """A ``servehall serve`` started by the soak in ``workdir``."""

    process: subprocess.Popen[bytes]
    base_url: str
    workdir: Path
    config: Path
    log_path: Path
    stop_s: float | None = None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        t0 = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.stop_s = time.monotonic() - t0
        return self.process.returncode


def start_server(opts: SoakOptions, workdir: Path) -> Server:
    """Start ``servehall serve`` (``--demo`` and/or ``--config``) on a free port in
    ``workdir`` and wait for ``/health/ready``; SoakError with the log tail if not."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = opts.config.resolve() if opts.config is not None else None
    if config is None:
        config = workdir / "soak.toml"
        url = f"sqlite+aiosqlite:///{workdir / 'servehall.db'}"
        config.write_text(f'[database]\nurl = "{url}"\n')
    port = free_port()
    args = [*servehall_cmd(), "serve", "--config", str(config), "--bind", f"127.0.0.1:{port}"]
    if opts.demo:
        args.append("--demo")
    log_path = workdir / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", workdir, config, log_path)
    deadline = time.monotonic() + opts.ready_timeout_s
    with httpx.Client(timeout=5.0) as c:
        while True:
            if proc.poll() is not None:
                raise SoakError(
                    f"servehall serve exited with {proc.returncode}:\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if c.get(server.base_url + "/health/ready").status_code == 200:
                    return server
            if time.monotonic() > deadline:
                server.stop(10)
                raise SoakError(f"servehall serve not ready in time:\n{server.log_tail()}")
            time.sleep(0.3)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def rss_bytes(pids: Sequence[int]) -> int:
    """Summed ``VmRSS`` of ``pids`` (and their descendants) in bytes."""
    total = 0
    for root in pids:
        for p in process_tree(root):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
    return total


def worker_pids(server_pid: int) -> list[int]:
    """The engine worker processes under ``server_pid`` (multiprocessing spawn children,
    not the resource tracker)."""
    out = []
    for p in process_tree(server_pid)[1:]:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmd:
                out.append(p)
    return out


# --- the clients -----------------------------------------------------------------------


def _error_status(envelope: Any) -> int:
    """The HTTP status an SSE error event stands for: a numeric ``status``/``code``, else
    the status of servehall's error with that ``code``, else by ``type`` (500 unless it
    says otherwise)."""
    err = envelope.get("error") if isinstance(envelope, dict) else None
    if not isinstance(err, dict):
        return 500
    for key in ("status", "code"):
        v = err.get(key)
        if isinstance(v, int) and 400 <= v < 600:
            return v
    code = err.get("code")
    status = status_of_code(code) if isinstance(code, str) else None
    if status is not None:  # e.g. engine_unavailable: a 503 whose type is server_error
        return status
    if err.get("type") in ("server_error", "internal_error", "service_unavailable"):
        return 503 if err.get("type") == "service_unavailable" else 500
    return 400


#: The last event of a ``/v1/responses`` stream: its ``response`` holds the usage.
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _usage(obj: Any) -> tuple[int, int] | None:
    """``(prompt, completion)`` tokens of a chat/completions body or usage chunk
    (``usage.prompt_tokens``), of a ``response`` object or of the event that ends a
    Responses stream (``usage.input_tokens``, ``usage.output_tokens``)."""
    if isinstance(obj, dict) and obj.get("type") in RESPONSE_ENDS:
        obj = obj.get("response")
    u = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
        return int(u["prompt_tokens"]), int(u.get("completion_tokens") or 0)
    if isinstance(u, dict) and isinstance(u.get("input_tokens"), int):
        return int(u["input_tokens"]), int(u.get("output_tokens") or 0)
    return None


async def send(client: httpx.AsyncClient, base_url: str, shape: Shape) -> Observation:
    """Send ``shape`` and observe the answer (status, id, usage, stream errors)."""
    t0 = time.monotonic()
    obs = Observation(shape.name, shape.path, t0, t0, 0, disconnected=shape.disconnect)
    headers = {"content-type": shape.content_type}
    try:
        req = client.build_request(
            "POST", base_url + shape.path, content=shape.content(), headers=headers
        )
        resp = await client.send(req, stream=True)
        try:
            obs.status = resp.status_code
            obs.request_id = resp.headers.get("x-request-id")
            sse = resp.headers.get("content-type", "").startswith("text/event-stream")
            obs.stream = sse
            if not sse:
                raw = await resp.aread()
                with contextlib.suppress(ValueError):
                    doc = json.loads(raw)
                    obs.usage = _usage(doc) if resp.status_code == 200 else None
                    if resp.status_code >= 500 and isinstance(doc, dict):
                        err = doc.get("error")
                        if isinstance(err, dict):
                            obs.error = f"{err.get('code')}: {str(err.get('message'))[:100]}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if shape.disconnect:
                        break  # leave after the first event
                    if data == "[DONE]":
                        continue
                    with contextlib.suppress(ValueError):
                        ev = json.loads(data)
                        if isinstance(ev, dict) and "error" in ev:
                            obs.stream_error = _error_status(ev)
                        elif isinstance(ev, dict) and ev.get("type") == "response.failed":
                            obs.stream_error = _error_status(ev.get("response"))
                            obs.usage = _usage(ev)
                        elif (u := _usage(ev)) is not None:
                            obs.usage = u
        finally:
            await resp.aclose()
    except httpx.HTTPError as exc:
        if not (shape.disconnect and obs.status):
            obs.error = f"{type(exc).__name__}: {str(exc)[:120]}"
    obs.ended = time.monotonic()
    return obs


@dataclass
class Traffic:
    """What the clients did."""

    observations: list[Observation] = field(default_factory=list)
    by_category: Counter[str] = field(default_factory=Counter)
    faults: list[FaultWindow] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    duration_s: float = 0.0


async def _clients(opts: SoakOptions, base_url: str, mix: Mix, traffic: Traffic) -> None:
    headers = {"authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.clients, max_keepalive_connections=opts.clients)
    timeout = httpx.Timeout(opts.request_timeout_s, connect=10.0)
    deadline = time.monotonic() + opts.duration_s
    async with httpx.AsyncClient(
        http2=True, http1=False, headers=headers, limits=limits, timeout=timeout
    ) as client:

        async def one_client() -> None:
            while time.monotonic() < deadline:
                cat, shape = mix.draw()
                traffic.by_category[cat] += 1
                if shape.disconnect:
                    # A client that leaves closes its own connection. On the shared one,
                    # httpcore would leave the stream open (no RST_STREAM on an early
                    # close, encode/httpcore#943): the bytes still in flight are never
                    # credited back, and once the connection's window is used up every
                    # stream on it stalls (the server then ends them after
                    # [server] send_timeout_s, as 499 client_stalled).
                    async with httpx.AsyncClient(
                        http2=True, http1=False, headers=headers, timeout=timeout
                    ) as own:
                        traffic.observations.append(await send(own, base_url, shape))
                    continue
                traffic.observations.append(await send(client, base_url, shape))

        await asyncio.gather(*(one_client() for _ in range(opts.clients)))


async def _sample_rss(
    pids: Sequence[int], traffic: Traffic, t0: float, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        traffic.rss.append((time.monotonic() - t0, rss_bytes(pids)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _ready(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=3.0) as c:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(base_url + "/health/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.2)


async def _inject_faults(
    opts: SoakOptions,
    server: Server | None,
    targets: FaultTargets,
    traffic: Traffic,
    out: TextIO,
) -> None:
    if not opts.faults or server is None:
        return
    interval = opts.fault_interval_s or opts.duration_s / (len(opts.faults) + 1)
    t_end = time.monotonic() + opts.duration_s
    i = 0
    while True:
        await asyncio.sleep(interval)
        if time.monotonic() + 5 > t_end:
            return
        fault = opts.faults[i % len(opts.faults)]
        i += 1
        start = time.monotonic()
        try:
            what = await _inject(fault, server, targets, opts.fault_stop_s)
        except FaultError as exc:
            traffic.fault_errors.append(f"{fault}: {exc}")
            print(f"fault {fault} not injected: {exc}", file=out)
            what = "failed"
        await asyncio.sleep(1.0)
        await _ready(server.base_url, 120.0)
        end = time.monotonic() + 3.0  # requests answered just after readiness
        traffic.faults.append(FaultWindow(fault, start, end))
        print(f"fault {fault} ({what}): window {end - start:.1f} s", file=out)


async def _inject(fault: str, server: Server, targets: FaultTargets, stop_s: float) -> str:
    """Inject one fault (see :mod:`servehall.bench.soak.faults`); what it acted on."""
    if fault in ("worker-kill", "worker-stop"):
        pids = worker_pids(server.process.pid)
        if fault == "worker-kill":
            for p in pids:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        else:
            await stop_processes(pids, stop_s)
        return f"pids {pids}"
    if fault == "db-stop":
        assert targets.db_pid is not None
        pids = process_tree(targets.db_pid)
        await stop_processes(pids, stop_s)
        return f"postmaster {targets.db_pid} and {len(pids) - 1} children stopped {stop_s:g} s"
    if fault == "db-restart":
        if targets.db_restart_cmd:
            await asyncio.to_thread(run_shell, targets.db_restart_cmd, targets.log)
            return f"ran {targets.db_restart_cmd!r}"
        assert targets.db_pid is not None
        old = targets.db_pid
        _, targets.db_pid = await asyncio.to_thread(pg_ctl_restart, old, targets.log)
        return f"pg_ctl restart: postmaster {old} -> {targets.db_pid}"
    assert fault == "redis-restart" and targets.redis_restart_cmd
    await asyncio.to_thread(run_shell, targets.redis_restart_cmd, targets.log)
    return f"ran {targets.redis_restart_cmd!r}"


def planned_database_url(opts: SoakOptions) -> str | None:
    """The database the soak's server will write to, before it starts (a started
    ``--demo`` without ``--config`` gets a SQLite file); None when unknown."""
    if opts.db_url:
        return opts.db_url
    if opts.config is not None:
        from servehall.config.settings import load_settings

        return load_settings(opts.config).database.url.get_secret_value()
    return "sqlite+aiosqlite:///servehall.db" if opts.url is None else None


def check_fault_options(opts: SoakOptions) -> None:
    """Refuse the faults this deployment cannot have (SoakError with the reason)."""
    if not opts.faults:
        return
    redis: list[str] = []
    if opts.config is not None and "redis-restart" in opts.faults:
        from servehall.config.settings import load_settings

        redis = redis_urls(load_settings(opts.config))
    try:
        check_faults(
            opts.faults,
            starts_server=opts.url is None,
            db_url=planned_database_url(opts),
            redis=redis,
            db_pid=opts.db_pid,
            redis_restart_cmd=opts.redis_restart_cmd,
            stop_s=opts.fault_stop_s,
        )
    except FaultError as exc:
        raise SoakError(str(exc)) from None


async def fault_targets(opts: SoakOptions, workdir: Path, out: TextIO) -> FaultTargets:
    """The processes and commands the faults act on; the postmaster is found from the
    database when a database fault needs it and ``--db-pid`` is not given."""
    targets = FaultTargets(
        db_pid=opts.db_pid,
        db_restart_cmd=opts.db_restart_cmd,
        redis_restart_cmd=opts.redis_restart_cmd,
        log=workdir / "faults.log",
    )
    needs_pid = "db-stop" in opts.faults or (
        "db-restart" in opts.faults and not opts.db_restart_cmd
    )
    if DB_FAULTS & set(opts.faults) and needs_pid and targets.db_pid is None:
        url = planned_database_url(opts)
        assert url is not None
        try:
            targets.db_pid = await postmaster_pid(url)
        except FaultError as exc:
            raise SoakError(str(exc)) from None
    if targets.db_pid is not None:
        print(f"database faults act on postmaster {targets.db_pid}", file=out)
    return targets


# --- after the stop --------------------------------------------------------------------


def database_url(opts: SoakOptions, server: Server | None) -> str | None:
    """The SQL database the server writes its rows to (None: unknown)."""
    if opts.db_url:
        return opts.db_url
    config = server.config if server is not None else opts.config
    if config is None:
        return None
    from servehall.config.settings import load_settings

    url = load_settings(config).database.url.get_secret_value()
    if url.startswith("sqlite") and ":///" in url and server is not None:
        path = url.split(":///", 1)[1]
        if path and not path.startswith("/"):
            url = url.split(":///", 1)[0] + ":///" + str(server.workdir / path)
    return url


async def read_rows(url: str, ids: Sequence[str]) -> tuple[list[Row], list[Rejection], bool]:
    """The ``request_log`` rows of ``ids`` (every row, duplicates included), the
    rejected records (``record_rejected`` rows, when that table exists) and whether it
    exists."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    rows: list[Row] = []
    rejections: list[Rejection] = []
    try:
        async with engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                q = sa.text(
                    "SELECT request_id, status_code, prompt_tokens, completion_tokens "
                    "FROM request_log WHERE request_id IN :ids"
                ).bindparams(sa.bindparam("ids", expanding=True))
                for r in (await conn.execute(q, {"ids": chunk})).all():
                    rows.append(Row(str(r[0]), int(r[1]), int(r[2] or 0), int(r[3] or 0)))
            tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            has_rejected = "record_rejected" in tables
            if has_rejected:
                res = await conn.execute(sa.text("SELECT * FROM record_rejected"))
                for m in res.mappings().all():
                    rid = m.get("request_id")
                    err = m.get("error") or m.get("reason") or m.get("message")
                    rejections.append(Rejection(rid and str(rid), err and str(err)))
    finally:
        await engine.dispose()
    return rows, rejections, has_rejected


def leftover_files(dirs: Sequence[Path]) -> tuple[list[LeftoverFile], list[Rejection]]:
    """Spill files (``servehall-spill-*.jsonl``) and quarantine files (``*quarantine*``,
    ``*rejected*``) in ``dirs``, with the rejections the quarantine files hold (a line
    with an ``error``/``reason`` key is explained)."""
    files: list[LeftoverFile] = []
    rejections: list[Rejection] = []
    seen: set[Path] = set()
    for d in dirs:
        for p in sorted(d.glob("*")):
            name = p.name.lower()
            if p in seen or not p.is_file():
                continue
            kind = (
                "spill"
                if name.startswith("servehall-spill")
                else "quarantine"
                if ("quarantine" in name or "rejected" in name)
                else None
            )
            if kind is None:
                continue
            seen.add(p)
            records = explained = 0
            with contextlib.suppress(OSError):
                for line in p.read_text(errors="replace").splitlines():
                    if not line.strip():
                        continue
                    records += 1
                    obj: Any = None
                    with contextlib.suppress(ValueError):
                        obj = json.loads(line)
                    if kind == "quarantine":
                        err = None
                        rid = None
                        if isinstance(obj, dict):
                            err = obj.get("error") or obj.get("reason")
                            rec = obj.get("record")
                            rid = obj.get("request_id") or (
                                rec.get("request_id") if isinstance(rec, dict) else None
                            )
                        explained += bool(err)
                        rejections.append(Rejection(rid and str(rid), err and str(err)))
            files.append(LeftoverFile(str(p), kind, records, explained))
    return files, rejections


def audit_verify(config: Path, workdir: Path | None) -> tuple[int | None, str]:
    """Run ``servehall audit verify --config CONFIG``: (exit code, output)."""
    try:
        proc = subprocess.run(
            [*servehall_cmd(), "audit", "verify", "--config", str(config)],
            capture_output=True,
            text=True,
            cwd=workdir,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr)


# --- the whole run ---------------------------------------------------------------------


def summarize_traffic(traffic: Traffic) -> list[str]:
    """Lines: requests per second, statuses, categories."""
    obs = traffic.observations
    statuses = Counter(o.status for o in obs)
    rate = len(obs) / traffic.duration_s if traffic.duration_s else 0.0
    lines = [
        f"requests: {len(obs)} in {traffic.duration_s:.0f} s ({rate:.1f}/s)",
        "by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())),
        "by category: " + ", ".join(f"{c}: {n}" for c, n in sorted(traffic.by_category.items())),
        f"streams with an error event: {sum(1 for o in obs if o.stream_error is not None)}",
    ]
    return lines


async def run_soak(opts: SoakOptions, out: TextIO = sys.stdout) -> list[InvariantResult]:
    """Run the soak and check the invariants; the printed report goes to ``out``."""
    if opts.url is None and not opts.demo and opts.config is None:
        raise SoakError("give --url, --config or --demo")
    check_fault_options(opts)
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="servehall-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    targets = await fault_targets(opts, workdir, out)
    server: Server | None = None
    if opts.url is None:
        print(f"starting servehall serve in {workdir}", file=out)
        server = await asyncio.to_thread(start_server, opts, workdir)
        base_url = server.base_url
    else:
        base_url = opts.url.rstrip("/").removesuffix("/v1")
    mix = Mix(opts.model, opts.max_tokens, opts.seed, opts.schemas)
    counts = ", ".join(f"{k} {v}" for k, v in mix.counts().items())
    print(
        f"soak {base_url}: {opts.clients} clients, {opts.duration_s:g} s; shapes: {counts}",
        file=out,
    )
    print("recorded client bodies: " + ("; ".join(sdk_libraries()) or "none"), file=out)
    pids = tuple(opts.pids) or ((server.process.pid,) if server is not None else ())
    traffic = Traffic()
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampler = asyncio.create_task(_sample_rss(pids, traffic, t0, stop)) if pids else None
    faults = asyncio.create_task(_inject_faults(opts, server, targets, traffic, out))
    try:
        await _clients(opts, base_url, mix, traffic)
    finally:
        traffic.duration_s = time.monotonic() - t0
        faults.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await faults
        if sampler is not None:
            stop.set()
            await sampler
        if server is not None:
            code = await asyncio.to_thread(server.stop)
            print(f"server stopped (exit {code}) in {server.stop_s:.1f} s", file=out)
    for line in summarize_traffic(traffic):
        print(line, file=out)
    results = [check_no_5xx(traffic.observations, traffic.faults)]
    if opts.faults:
        injected = InvariantResult("F", "declared faults injected", checked=len(traffic.faults))
        injected.violations += traffic.fault_errors
        injected.notes += [f"{w.name}: window {w.end - w.start:.1f} s" for w in traffic.faults]
        results.append(injected)
    results += await _record_checks(opts, server, traffic)
    results.append(check_rss(traffic.rss, opts.rss_bound_mib, warmup_s=_warmup(opts)))
    for r in results:
        for line in r.lines():
            print(line, file=out)
    if opts.output_json is not None:
        opts.output_json.write_text(json.dumps(_report(opts, traffic, results), indent=2))
    if server is not None and any(r.violations for r in results):
        print(f"server log: {server.log_path}", file=out)
    return results


async def _record_checks(
    opts: SoakOptions, server: Server | None, traffic: Traffic
) -> list[InvariantResult]:
    """I2–I5 (skipped when the database is unknown)."""
    url = database_url(opts, server)
    if url is None:
        skipped = []
        for key, title in (
            ("I2", "rows"),
            ("I3", "row contents"),
            ("I4", "leftovers"),
            ("I5", "audit verify"),
        ):
            r = InvariantResult(key, title)
            r.skipped = "the database is unknown (give --config or --db-url)"
            skipped.append(r)
        return skipped
    if server is None:
        await asyncio.sleep(5.0)  # let a running server's sinks flush
    ids = [o.request_id for o in traffic.observations if o.request_id]
    rows, rejections, _ = await read_rows(url, ids)
    dirs = [server.workdir] if server is not None else [Path.cwd()]
    files, file_rejections = leftover_files(dirs)
    rejections += file_rejections
    rejected_ids = {r.request_id for r in rejections if r.request_id and r.error}
    by_id = {r.request_id: r for r in rows}
    results = [
        check_one_row_each(traffic.observations, [r.request_id for r in rows], rejected_ids),
        check_rows_match(traffic.observations, by_id),
        check_no_leftovers(files, rejections),
    ]
    config = server.config if server is not None else opts.config
    if config is None:
        r = InvariantResult("I5", "servehall audit verify passes")
        r.skipped = "no config to verify with (give --config)"
        results.append(r)
    else:
        code, output = await asyncio.to_thread(
            audit_verify, config, server.workdir if server else None
        )
        results.append(check_audit(code, output))
    return results


def _warmup(opts: SoakOptions) -> float:
    """The RSS warm-up: a quarter of the run, at most 5 minutes."""
    return min(300.0, opts.duration_s / 4)


def _report(opts: SoakOptions, traffic: Traffic, results: list[InvariantResult]) -> dict[str, Any]:
    statuses = Counter(str(o.status) for o in traffic.observations)
    base, growth = 0.0, 0.0
    if traffic.rss:
        from servehall.bench.soak.invariants import rss_growth_mib

        base, growth = rss_growth_mib(traffic.rss, _warmup(opts))
    return {
        "duration_s": traffic.duration_s,
        "clients": opts.clients,
        "requests": len(traffic.observations),
        "by_status": dict(statuses),
        "by_category": dict(traffic.by_category),
        "faults": [{"name": w.name, "window_s": w.end - w.start} for w in traffic.faults],
        "rss_baseline_mib": base,
        "rss_growth_mib": growth,
        "invariants": {
            r.key: {
                "title": r.title,
                "checked": r.checked,
                "violation_count": len(r.violations),
                "skipped": r.skipped,
                "notes": r.notes,
                "violations": r.violations[:1000],
            }
            for r in results
        },
    }
