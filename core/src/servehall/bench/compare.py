"""``servehall bench compare``: several targets, one workload, one after the other.

Targets (positional arguments):

* ``engine:MODEL`` — the ``[[models]]`` entry ``MODEL`` of ``--config``, in-process
  through the ``Engine`` protocol (``engine-native:MODEL`` for the backend's own API);
* ``serve:URL`` — any OpenAI-compatible server; suffixes ``,h1`` / ``,h2`` pick the HTTP
  version (default h2) and ``,pid=N`` names the server process whose CPU time (with its
  child processes) is recorded;
* ``vllm-server:MODEL`` — vLLM's own OpenAI server for the ``[[models]]`` entry ``MODEL``
  of ``--config`` (same model directory, vLLM options and ``worker.python``), started for
  this target only (:mod:`servehall.bench.vllm_server`); its CPU time is recorded;
* ``launch:h2`` / ``launch:h1`` — the bench starts ``servehall serve --config CONFIG``
  itself on a free 127.0.0.1 port (once, shared by every ``launch`` target), records its
  CPU time, and stops it at the end.

``launch:`` and ``vllm-server:`` targets take ``,api=N``: the server runs N API
processes — servehall with ``[server] api_processes = N`` (the environment variable
``SERVEHALL_SERVER__API_PROCESSES``, over the config), vLLM as ``vllm serve
--api-server-count N`` — and is started for that target only (``launch:h2,api=N`` does
not share the ``launch`` server). ``--api-processes 1,2,4`` repeats the ``launch:`` and
``vllm-server:`` targets once per count (:func:`expand_api_processes`). The kernel hands
each *connection* to one API process, and the bench's HTTP/2 client multiplexes every
request over one connection: a ``launch:h2`` target loads one of the N processes. Use
``launch:h1`` (one connection per concurrent request, as with ``vllm-server:``) to load
all of them.

Ratios are against the first target. CPU per output token is ``cpu_s ÷ output tokens``;
for a server target, **frontend CPU per token** = server CPU per token − engine CPU per
token, the engine figure coming from the first ``engine`` target of the same run (the
engine target's CPU is this process's CPU during its run, all threads). For a server
target, **client CPU per token** is this process's CPU during the run (the load generator:
httpx, h2, SSE parsing) per output token: on a machine with few cores it competes with the
server and the engine for the same CPUs, which the engine target's run does not. The server's
CPU is also split by process: **API CPU per token** (the server process itself) and
**worker CPU per token** (its descendants: the engine worker processes), the latter also
as a ratio to the engine target's CPU per token (``worker_vs_engine``). With servehall's
HTTP frontends (``api_processes`` > 1) the API CPU is the serve process's and the
frontends' together, and **frontends CPU per token** is the frontends' share
(:mod:`servehall.bench.processes`); a process tree of another server (vLLM's API servers
and engine core) counts as worker CPU. Each target gets
one short unmeasured warm-up request first (the
preflight request of a server target).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servehall.bench.client import ClientOptions, TargetError
from servehall.bench.metrics import BenchSummary, summarize
from servehall.bench.processes import (
    FRONTEND,
    WORKER,
    cpu_by_role,
    frontend_cpu_s,
    process_roles_cpu_s,
)
from servehall.bench.processes import api_cpu_s as api_cpu
from servehall.bench.report import ratio
from servehall.bench.runner import RunResult
from servehall.bench.workload import BenchRequest

if TYPE_CHECKING:
    from servehall.bench.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Target:
    """One parsed target (see the module docstring)."""

    spec: str
    kind: str  # "engine" | "serve" | "launch" | "vllm-server"
    model: str = ""
    url: str = ""
    http2: bool = True
    pid: int | None = None
    native: bool = False
    response_format: str | None = None  # ``rf=``: overrides --response-format
    api_processes: int | None = None  # ``api=``: the server's API processes

    @property
    def label(self) -> str:
        return self.spec


def parse_target(text: str) -> Target:
    """Parse one target string. Raises ValueError with a one-line reason."""
    kind, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(
            f"target {text!r} is not engine:MODEL, serve:URL[,h1][,pid=N][,rf=none|json] "
            "or launch:h2|h1[,rf=none|json]"
        )
    rest, rf = _response_format_option(text, rest)
    rest, api = _api_option(text, rest)
    if api is not None and kind not in ("launch", "vllm-server"):
        raise ValueError(f"target {text!r}: api=N is for launch: and vllm-server: targets")
    if kind in ("engine", "engine-native"):
        return Target(text, "engine", model=rest, native=kind == "engine-native")
    if kind == "vllm-server":
        return Target(text, "vllm-server", model=rest, api_processes=api)
    if kind == "launch":
        if rest not in ("h1", "h2"):
            raise ValueError(f"target {text!r}: launch takes h1 or h2")
        return Target(text, "launch", http2=rest == "h2", response_format=rf, api_processes=api)
    if kind == "serve":
        url, *opts = rest.split(",")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"target {text!r}: the URL must start with http:// or https://")
        http2, pid = True, None
        for opt in opts:
            if opt in ("h1", "h2"):
                http2 = opt == "h2"
            elif opt.startswith("pid="):
                try:
                    pid = int(opt[4:])
                except ValueError:
                    raise ValueError(f"target {text!r}: {opt!r} is not pid=NUMBER") from None
            else:
                raise ValueError(f"target {text!r}: unknown option {opt!r} (h1, h2, pid=N)")
        return Target(text, "serve", url=url, http2=http2, pid=pid, response_format=rf)
    raise ValueError(
        f"target {text!r}: unknown kind {kind!r} (engine, engine-native, serve, launch, "
        "vllm-server)"
    )


async def grammar_counters(opts: Any) -> dict[str, Any]:
    """The server's grammar counters for ``opts.model`` from ``GET /metrics``:
    ``hits``, ``misses``, ``sum`` (compile seconds) and ``buckets`` ({bound: count})."""
    import httpx

    out: dict[str, Any] = {"hits": 0.0, "misses": 0.0, "sum": 0.0, "buckets": {}}
    label = f'model="{opts.model}"'
    try:
        async with httpx.AsyncClient(timeout=30) as c:
            text = (await c.get(opts.root + "/metrics")).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if label not in line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("servehall_grammar_cache_hits_total"):
            out["hits"] = float(value)
        elif name.startswith("servehall_grammar_compile_seconds_count"):
            out["misses"] = float(value)
        elif name.startswith("servehall_grammar_compile_seconds_sum"):
            out["sum"] = float(value)
        elif name.startswith("servehall_grammar_compile_seconds_bucket"):
            bound = name.split('le="', 1)[1].split('"', 1)[0]
            out["buckets"][bound] = float(value)
    return out


def grammar_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Compiles, cache hit rate and compile P50/P99 (seconds, the histogram's bucket
    bound that holds them, as Prometheus' ``histogram_quantile`` without interpolation)
    between two :func:`grammar_counters` reads."""
    hits = after["hits"] - before["hits"]
    misses = after["misses"] - before["misses"]
    buckets = sorted(
        (
            (float(b), after["buckets"].get(b, 0.0) - before["buckets"].get(b, 0.0))
            for b in after["buckets"]
        ),
    )

    def quantile(q: float) -> float | None:
        if misses <= 0:
            return None
        for bound, count in buckets:
            if count >= q * misses:
                return bound
        return None

    return {
        "compiles": int(misses),
        "cache_hits": int(hits),
        "cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        "compile_s_sum": after["sum"] - before["sum"],
        "compile_p50_s": quantile(0.5),
        "compile_p99_s": quantile(0.99),
    }


def _response_format_option(text: str, rest: str) -> tuple[str, str | None]:
    """Split a trailing ``,rf=none|json`` off a target's options."""
    parts = rest.split(",")
    rf = None
    keep = []
    for part in parts:
        if part.startswith("rf="):
            if part[3:] not in ("none", "json"):
                raise ValueError(f"target {text!r}: {part!r} is not rf=none or rf=json")
            rf = part[3:]
        else:
            keep.append(part)
    return ",".join(keep), rf


def _api_option(text: str, rest: str) -> tuple[str, int | None]:
    """Split an ``,api=N`` (API processes, 1…64) off a target's options."""
    from servehall.bench.processes import parse_api_processes

    keep, api = [], None
    for part in rest.split(","):
        if part.startswith("api="):
            try:
                (api,) = parse_api_processes(part[4:])
            except ValueError:
                raise ValueError(
                    f"target {text!r}: {part!r} is not api=N with N in 1..64"
                ) from None
        else:
            keep.append(part)
    return ",".join(keep), api


def expand_api_processes(targets: Sequence[str], counts: Sequence[int]) -> list[str]:
    """The targets of ``--api-processes``: for each count in order, every ``launch:`` and
    ``vllm-server:`` target (one without ``api=``) with ``,api=N`` added; other targets
    (and those with their own ``api=``) once, where they first appear. With no
    ``counts``: ``targets`` unchanged."""
    if not counts:
        return list(targets)
    out: list[str] = []
    for i, n in enumerate(counts):
        for t in targets:
            kind = t.partition(":")[0]
            scalable = kind in ("launch", "vllm-server") and "api=" not in t
            if scalable:
                out.append(f"{t},api={n}")
            elif i == 0:
                out.append(t)
    return out


@dataclass(slots=True)
class TargetRun:
    """The outcome of one target: its summary, raw result and CPU seconds."""

    target: Target
    summary: BenchSummary
    result: RunResult
    cpu_s: float | None
    info: dict[str, Any] = field(default_factory=dict)
    client_cpu_s: float | None = None
    api_cpu_s: float | None = None
    worker_cpu_s: float | None = None
    frontends_cpu_s: float | None = None


def run_labels(runs: Sequence[TargetRun]) -> list[str]:
    """Each run's target label, a repeated one numbered from its second run
    (``engine``, ``engine #2``…): a target given twice (to see run-to-run spread) keeps
    both runs apart in the table, the JSON summaries and the plot."""
    seen: dict[str, int] = {}
    out = []
    for r in runs:
        label = r.target.label
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def comparison_rows(runs: Sequence[TargetRun]) -> list[dict[str, Any]]:
    """One dict per run: figures, ratios to the first run, CPU per token and frontend CPU
    per token (see the module docstring)."""
    if not runs:
        return []
    base = runs[0].summary
    engine_us = next(
        (
            r.cpu_s / r.summary.total_output_tokens * 1e6
            for r in runs
            if r.target.kind == "engine" and r.cpu_s is not None and r.summary.total_output_tokens
        ),
        None,
    )
    rows = []
    for r, label in zip(runs, run_labels(runs), strict=True):
        s = r.summary
        cpu_us = (
            r.cpu_s / s.total_output_tokens * 1e6
            if r.cpu_s is not None and s.total_output_tokens
            else None
        )
        frontend = (
            cpu_us - engine_us
            if cpu_us is not None and engine_us is not None and r.target.kind != "engine"
            else None
        )
        client_us, api_us, worker_us, frontends_us = (
            v / s.total_output_tokens * 1e6 if v is not None and s.total_output_tokens else None
            for v in (r.client_cpu_s, r.api_cpu_s, r.worker_cpu_s, r.frontends_cpu_s)
        )
        rows.append(
            {
                "target": label,
                "kind": r.target.kind,
                "sent": s.completed + s.failed,
                "completed": s.completed,
                "output_throughput": s.output_throughput,
                "throughput_ratio": ratio(s.output_throughput, base.output_throughput),
                "ttft_p50_ms": s.ttft_ms.median,
                "tpot_p50_ms": s.tpot_ms.median,
                "itl_p50_ms": s.itl_ms.median,
                "itl_p50_ratio": ratio(s.itl_ms.median, base.itl_ms.median),
                "e2el_p50_ms": s.e2el_ms.median,
                "e2el_p50_added_ms": s.e2el_ms.median - base.e2el_ms.median,
                "cpu_s": r.cpu_s,
                "cpu_us_per_token": cpu_us,
                "frontend_cpu_us_per_token": frontend,
                "client_cpu_us_per_token": client_us,
                "api_cpu_us_per_token": api_us,
                "worker_cpu_us_per_token": worker_us,
                "frontends_cpu_us_per_token": frontends_us,
                "api_processes": r.target.api_processes,
                "worker_vs_engine": ratio(worker_us, engine_us),
                **r.info,
            }
        )
    return rows


async def run_target(
    target: Target,
    spec: WorkloadSpec,
    requests: Sequence[BenchRequest],
    *,
    config: Path | None,
    model: str,
    api_key: str | None,
    launched: tuple[str, int] | None,
    quiet: bool,
) -> TargetRun:
    """Warm up, run and summarise one target."""
    from servehall.bench.targets import run_engine, run_serve

    if target.kind == "engine":
        from servehall.bench.engine_driver import loaded_engine

        async with loaded_engine(config, target.model) as loaded:
            result, cpu_s, api = await run_engine(
                loaded, spec, requests, native=target.native, quiet=quiet, label=target.label
            )
        info = {"backend": loaded.backend, "api": api}
        return TargetRun(
            target,
            summarize(result.outputs, result.duration_s, spec.slo, cpu_s),
            result,
            cpu_s,
            info,
        )
    if target.kind == "vllm-server":
        from servehall.bench.vllm_server import launched_vllm
        from servehall.config.settings import load_settings

        assert config is not None
        mc = next((m for m in load_settings(config).models if m.name == target.model), None)
        if mc is None:
            raise TargetError(f"{target.label}: no [[models]] entry {target.model!r} in {config}")
        with launched_vllm(mc, model, api_server_count=target.api_processes) as (
            vllm_url,
            vllm_pid,
        ):
            served = Target(target.spec, "serve", url=vllm_url, http2=False, pid=vllm_pid)
            run = await run_target(
                served,
                spec,
                requests,
                config=config,
                model=model,
                api_key=api_key,
                launched=None,
                quiet=quiet,
            )
        run.target = target
        return run
    if target.kind == "launch" and target.api_processes is not None:
        from servehall.bench.launch import launched_server

        assert config is not None
        with launched_server(config, api_processes=target.api_processes) as own:
            run = await run_target(
                Target(
                    target.spec,
                    "launch",
                    http2=target.http2,
                    response_format=target.response_format,
                ),
                spec,
                requests,
                config=config,
                model=model,
                api_key=api_key,
                launched=own,
                quiet=quiet,
            )
        run.target = target
        return run
    pid: int | None = target.pid
    url = target.url
    if target.kind == "launch":
        assert launched is not None
        url, pid = launched
    from servehall.bench.workload import response_format_body

    rf = target.response_format or spec.response_format
    opts = ClientOptions(
        url,
        model,
        api_key,
        spec.endpoint,
        http2=target.http2,
        ignore_eos=spec.ignore_eos,
        response_format=response_format_body(rf),
    )
    grammar0 = await grammar_counters(opts) if rf != "none" else None
    cpu0: list[dict[int, tuple[str, float]]] = []
    client0: list[float] = []

    def mark() -> None:
        client0.append(time.process_time())
        if pid is not None:
            cpu0.append(process_roles_cpu_s(pid))

    result = await run_serve(
        opts, spec, requests, quiet=quiet, label=target.label, after_preflight=mark
    )
    client_cpu_s = time.process_time() - client0[0] if client0 else None
    api_cpu_s = worker_cpu_s = serve_cpu_s = frontends_cpu_s = None
    if pid is not None and cpu0:
        by_role = cpu_by_role(cpu0[0], process_roles_cpu_s(pid))
        frontends_cpu_s = frontend_cpu_s(by_role)
        api_cpu_s, worker_cpu_s = api_cpu(by_role), by_role[WORKER]
        serve_cpu_s = api_cpu_s + worker_cpu_s
    serve_info: dict[str, Any] = {"protocol": "h2" if target.http2 else "http/1.1"}
    if grammar0 is not None:
        serve_info["response_format"] = rf
        serve_info["grammar"] = grammar_delta(grammar0, await grammar_counters(opts))
    summary = summarize(result.outputs, result.duration_s, spec.slo, serve_cpu_s)
    return TargetRun(
        target,
        summary,
        result,
        serve_cpu_s,
        serve_info,
        client_cpu_s,
        api_cpu_s,
        worker_cpu_s,
        frontends_cpu_s if by_frontend(cpu0) else None,
    )


def by_frontend(reads: Sequence[dict[int, tuple[str, float]]]) -> bool:
    """Whether the server had HTTP frontend processes at the first CPU read."""
    return bool(reads) and any(role == FRONTEND for role, _ in reads[0].values())
