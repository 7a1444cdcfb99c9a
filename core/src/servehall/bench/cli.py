"""``servehall bench serve | engine | compare | soak`` (Typer), registered by the core's
``servehall.defaults.commands``.

Every failure the user can cause (an unreachable URL, a refused key, an unknown model,
``--num-requests 0``, an unknown dataset, a missing file) ends with one line on stderr
(``error: ...``) and exit status 1 (target failures) or 2 (bad arguments).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console

from servehall.bench.client import Endpoint, TargetError
from servehall.bench.report import make_console
from servehall.bench.workload import DATASETS, WorkloadError, WorkloadSpec

T = TypeVar("T")

bench_app = typer.Typer(
    help="Measure a server, an engine, or several side by side (vLLM's benchmark metrics).",
    no_args_is_help=True,
)


class UsageError(Exception):
    """A bad option value (exit status 2)."""


# --- options shared by the three commands -----------------------------------------------

NumRequests = Annotated[int, typer.Option("--num-requests", "-n", help="Requests to send.")]
Concurrency = Annotated[
    int | None,
    typer.Option("--concurrency", help="Most requests in flight (default: no cap)."),
]
RequestRate = Annotated[
    float | None,
    typer.Option(
        "--request-rate",
        help="Requests per second, Poisson arrivals (default: all at once, i.e. inf).",
    ),
]
Burstiness = Annotated[
    float, typer.Option("--burstiness", help="Gamma shape of arrival gaps (1 = Poisson).")
]
Dataset = Annotated[str, typer.Option("--dataset", help=f"One of {', '.join(DATASETS)}.")]
DatasetPath = Annotated[
    Path | None, typer.Option("--dataset-path", help="ShareGPT JSON file (--dataset sharegpt).")
]
InputLen = Annotated[int, typer.Option("--input-len", help="Prompt tokens (random dataset).")]
OutputLen = Annotated[
    int | None,
    typer.Option(
        "--output-len",
        help="max_tokens per request (random default 128; "
        "sharegpt default: the recorded reply's length).",
    ),
]
RangeRatio = Annotated[
    float, typer.Option("--range-ratio", help="Random lengths vary by ± this fraction.")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of prompts and arrivals.")]
EndpointOpt = Annotated[
    str, typer.Option("--endpoint", help="chat (/v1/chat/completions) or completions.")
]
IgnoreEos = Annotated[
    bool,
    typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Ask for exactly max_tokens tokens (ignore_eos)."
    ),
]
ResponseFormat = Annotated[
    str,
    typer.Option(
        "--response-format",
        help="none (free text) or json (a mid-size JSON schema, structured output); "
        "compare targets may override it with ,rf=none|json.",
    ),
]
Slo = Annotated[
    str | None,
    typer.Option("--slo", help="Goodput SLOs in ms, e.g. ttft=500,tpot=50 (ttft|tpot|e2el)."),
]
OutputJson = Annotated[Path | None, typer.Option("--output-json", help="Write results as JSON.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write latency CDFs + throughput (PNG).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Deployment config (TOML/YAML).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


_WORKLOAD_OPTIONS = (
    "num_requests",
    "concurrency",
    "request_rate",
    "burstiness",
    "dataset",
    "dataset_path",
    "input_len",
    "output_len",
    "range_ratio",
    "seed",
    "endpoint",
    "ignore_eos",
    "slo",
    "response_format",
)
"""The parameters of :func:`workload_spec`: shared by ``bench serve|engine|compare``."""


def workload_from(options: dict[str, Any]) -> WorkloadSpec:
    """:func:`workload_spec` of the workload options among a command's parameters (the
    same names in every bench command)."""
    return workload_spec(**{name: options[name] for name in _WORKLOAD_OPTIONS})


def workload_spec(
    num_requests: int,
    concurrency: int | None,
    request_rate: float | None,
    burstiness: float,
    dataset: str,
    dataset_path: Path | None,
    input_len: int,
    output_len: int | None,
    range_ratio: float,
    seed: int,
    endpoint: str,
    ignore_eos: bool,
    slo: str | None,
    response_format: str = "none",
) -> WorkloadSpec:
    """Check the workload options (raises UsageError with one line)."""
    from servehall.bench.metrics import parse_slo

    if num_requests < 1:
        raise UsageError(f"--num-requests must be at least 1 (got {num_requests})")
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1 (got {concurrency})")
    rate = math.inf if request_rate is None else request_rate
    if not rate > 0:
        raise UsageError(f"--request-rate must be positive (got {request_rate})")
    if not burstiness > 0:
        raise UsageError(f"--burstiness must be positive (got {burstiness})")
    if dataset not in DATASETS:
        raise UsageError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    if dataset == "sharegpt" and dataset_path is None:
        raise UsageError("--dataset sharegpt needs --dataset-path FILE")
    if endpoint not in ("chat", "completions"):
        raise UsageError(f"--endpoint must be chat or completions (got {endpoint!r})")
    if input_len < 1:
        raise UsageError(f"--input-len must be at least 1 (got {input_len})")
    if output_len is not None and output_len < 1:
        raise UsageError(f"--output-len must be at least 1 (got {output_len})")
    if not 0 <= range_ratio < 1:
        raise UsageError(f"--range-ratio must be in [0, 1) (got {range_ratio})")
    try:
        slos = parse_slo(slo)
    except ValueError as exc:
        raise UsageError(f"--slo: {exc}") from None
    from servehall.bench.workload import RESPONSE_FORMATS

    if response_format not in RESPONSE_FORMATS:
        raise UsageError(f"--response-format must be none or json (got {response_format!r})")
    ep: Endpoint = "chat" if endpoint == "chat" else "completions"
    return WorkloadSpec(
        num_requests,
        concurrency,
        rate,
        burstiness,
        dataset,
        dataset_path,
        input_len,
        output_len,
        range_ratio,
        seed,
        ep,
        ignore_eos,
        slos,
        response_format,
    )


def bench_logging() -> None:
    """Log warnings, and servehall's own INFO lines (a model's conversion progress), in
    the server's format.

    Set before any target runs: an in-process engine imports xgrammar, whose import
    calls ``logging.basicConfig(level=INFO)`` when the root logger has no handler yet —
    which put a line for every HTTP request of the load generator (httpx logs each at
    INFO) into the report.
    """
    from servehall.server.logs import configure_logging

    configure_logging("warning")
    logging.getLogger("servehall").setLevel(logging.INFO)


def run_cli(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a fresh event loop (logging set by :func:`bench_logging`);
    expected failures become one line + exit."""
    from servehall.bench.plot import PlotError
    from servehall.errors import ServehallError

    bench_logging()
    try:
        return asyncio.run(main())
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except WorkloadError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (TargetError, PlotError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except ServehallError as exc:
        typer.echo(
            f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True
        )
        raise typer.Exit(1) from None


def checked(fn: Callable[[], T]) -> T:
    """Call ``fn``; UsageError → one line and exit status 2."""
    try:
        return fn()
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def load_tokenizer_or_fail(path: Path | None) -> Any:
    """The tokenizer of model directory ``path`` (None → None); TargetError otherwise."""
    if path is None:
        return None
    from servehall.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(path)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TargetError(f"cannot load a tokenizer from {path}: {msg}") from None


Mode = Literal["serve", "engine"]


def finish_run(
    console: Console,
    title: str,
    spec: WorkloadSpec,
    target: dict[str, Any],
    result: Any,
    cpu_s: float | None,
    output_json: Path | None,
    plot: Path | None,
) -> None:
    """Summarise, print, write JSON and plot one run; exit 1 when nothing succeeded."""
    from servehall.bench.metrics import summarize
    from servehall.bench.report import print_summary, write_json

    summary = summarize(result.outputs, result.duration_s, spec.slo, cpu_s=cpu_s)
    print_summary(console, title, summary)
    if output_json is not None:
        data = {"target": target, "workload": spec.describe(), "summary": summary.as_dict()}
        write_json(output_json, data)
    if plot is not None:
        from servehall.bench.plot import plot_runs

        plot_runs(plot, [(title, result.outputs, result.duration_s)], title=title)
    if summary.completed == 0:
        first = next((o.error for o in result.outputs if o.error), "no request succeeded")
        raise TargetError(f"every request failed ({first})")


# --- bench serve -------------------------------------------------------------------------


@bench_app.command("serve")
def serve_command(
    base_url: Annotated[
        str, typer.Option("--base-url", help="Server root, e.g. http://127.0.0.1:8000.")
    ],
    model: Annotated[str, typer.Option("--model", "-m", help="The model field of requests.")],
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key (or $OPENAI_API_KEY)."),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="Model directory whose tokenizer sizes prompts exactly "
            "(default: one word per token, approximately).",
        ),
    ] = None,
    http2: Annotated[
        bool, typer.Option("--http2/--http1", help="HTTP/2 (h2c on http://) or HTTP/1.1.")
    ] = True,
    num_requests: NumRequests = 64,
    concurrency: Concurrency = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = 1.0,
    dataset: Dataset = "random",
    dataset_path: DatasetPath = None,
    input_len: InputLen = 128,
    output_len: OutputLen = None,
    range_ratio: RangeRatio = 0.0,
    seed: Seed = 0,
    endpoint: EndpointOpt = "chat",
    ignore_eos: IgnoreEos = True,
    slo: Slo = None,
    response_format: ResponseFormat = "none",
    output_json: OutputJson = None,
    plot: PlotOpt = None,
    quiet: Quiet = False,
) -> None:
    """Load-test an OpenAI-compatible server (servehall, vllm serve, transformers serve...)
    with streamed requests: TTFT, TPOT, ITL, E2E, throughput, goodput."""
    options = dict(locals())  # the command line, before any other local
    spec = checked(lambda: workload_from(options))
    if not base_url.startswith(("http://", "https://")):
        typer.echo(
            f"error: --base-url must start with http:// or https:// (got {base_url!r})", err=True
        )
        raise typer.Exit(2)

    async def main() -> None:
        from servehall.bench.client import ClientOptions
        from servehall.bench.targets import run_serve

        tok = load_tokenizer_or_fail(tokenizer)
        requests = spec.requests(tok)
        from servehall.bench.workload import response_format_body

        opts = ClientOptions(
            base_url,
            model,
            api_key,
            spec.endpoint,
            http2=http2,
            ignore_eos=spec.ignore_eos,
            response_format=response_format_body(spec.response_format),
        )
        console = make_console()
        result = await run_serve(opts, spec, requests, quiet=quiet)
        proto = "h2" if http2 else "http/1.1"
        target = {"kind": "serve", "base_url": opts.root, "model": model, "protocol": proto}
        title = f"bench serve {opts.root} ({proto}, model {model})"
        finish_run(console, title, spec, target, result, None, output_json, plot)

    run_cli(main)


# --- bench engine ------------------------------------------------------------------------


@bench_app.command("engine")
def engine_command(
    model: Annotated[
        str, typer.Option("--model", "-m", help="A \\[\\[models]] name of the config.")
    ],
    config: ConfigOpt = None,
    num_requests: NumRequests = 64,
    concurrency: Concurrency = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = 1.0,
    dataset: Dataset = "random",
    dataset_path: DatasetPath = None,
    input_len: InputLen = 128,
    output_len: OutputLen = None,
    range_ratio: RangeRatio = 0.0,
    seed: Seed = 0,
    endpoint: EndpointOpt = "chat",
    ignore_eos: IgnoreEos = True,
    slo: Slo = None,
    response_format: ResponseFormat = "none",
    native: Annotated[
        bool,
        typer.Option(
            "--native",
            help="Drive the backend's own API (e.g. OpenVINO GenAI's "
            "ContinuousBatchingPipeline) instead of the Engine protocol, where it exposes one.",
        ),
    ] = False,
    output_json: OutputJson = None,
    plot: PlotOpt = None,
    quiet: Quiet = False,
) -> None:
    """The same workload straight into a model's engine, in-process (no HTTP, no host):
    the denominator of platform ÷ engine ratios."""
    options = dict(locals())  # the command line, before any other local
    spec = checked(lambda: workload_from(options))

    async def main() -> None:
        from servehall.bench.engine_driver import loaded_engine
        from servehall.bench.targets import run_engine

        console = make_console()
        async with loaded_engine(config, model) as loaded:
            requests = spec.requests(loaded.tokenizer, max_len=None)
            result, cpu_s, how = await run_engine(
                loaded, spec, requests, native=native, quiet=quiet
            )
        target = {"kind": "engine", "model": model, "backend": loaded.backend, "api": how}
        title = f"bench engine {model} ({loaded.backend}, {how})"
        finish_run(console, title, spec, target, result, cpu_s, output_json, plot)

    run_cli(main)


# --- bench compare -----------------------------------------------------------------------


@bench_app.command("compare")
def compare_command(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="engine:MODEL | engine-native:MODEL | serve:URL[,h1][,pid=N] | launch:h2 | "
            "launch:h1 | vllm-server:MODEL (vLLM's own server); ratios are against the first."
        ),
    ],
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model name (the [[models]] name for servehall).")
    ],
    config: ConfigOpt = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key for serve targets."),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="Model directory for prompt sizing (default: the config's model path).",
        ),
    ] = None,
    num_requests: NumRequests = 64,
    concurrency: Concurrency = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = 1.0,
    dataset: Dataset = "random",
    dataset_path: DatasetPath = None,
    input_len: InputLen = 128,
    output_len: OutputLen = None,
    range_ratio: RangeRatio = 0.0,
    seed: Seed = 0,
    endpoint: EndpointOpt = "chat",
    ignore_eos: IgnoreEos = True,
    slo: Slo = None,
    response_format: ResponseFormat = "none",
    output_json: OutputJson = None,
    plot: PlotOpt = None,
    quiet: Quiet = False,
) -> None:
    """Run several targets on the same workload, one after the other; print ratios against
    the first and CPU per token (frontend CPU = server CPU − engine CPU)."""
    options = dict(locals())  # the command line, before any other local
    from servehall.bench.compare import parse_target

    spec = checked(lambda: workload_from(options))

    def parse_all() -> list[Any]:
        if not targets:
            raise UsageError("give at least one target")
        try:
            parsed = [parse_target(t) for t in targets]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if any(t.kind in ("engine", "launch", "vllm-server") for t in parsed) and config is None:
            raise UsageError("engine:, launch: and vllm-server: targets need --config FILE")
        return parsed

    parsed = checked(parse_all)

    async def main() -> None:
        from contextlib import ExitStack

        from servehall.bench.compare import comparison_rows, run_target
        from servehall.bench.launch import launched_server
        from servehall.bench.report import comparison_table, print_summary, write_json

        tok_dir = tokenizer
        if tok_dir is None and config is not None:
            from servehall.config.settings import load_settings

            mc = next((m for m in load_settings(config).models if m.name == model), None)
            tok_dir = mc.path if mc is not None else None
        requests = spec.requests(load_tokenizer_or_fail(tok_dir))
        console = make_console()
        runs = []
        with ExitStack() as stack:
            launched = None
            if any(t.kind == "launch" for t in parsed):
                assert config is not None
                launched = stack.enter_context(launched_server(config))
            for t in parsed:
                run = await run_target(
                    t,
                    spec,
                    requests,
                    config=config,
                    model=model,
                    api_key=api_key,
                    launched=launched,
                    quiet=quiet,
                )
                runs.append(run)
                print_summary(console, t.label, run.summary)
        rows = comparison_rows(runs)
        console.print(comparison_table(rows, parsed[0].label))
        if output_json is not None:
            write_json(
                output_json,
                {
                    "workload": spec.describe(),
                    "rows": rows,
                    "summaries": {r.target.label: r.summary.as_dict() for r in runs},
                },
            )
        if plot is not None:
            from servehall.bench.plot import plot_runs

            plot_runs(plot, [(r.target.label, r.result.outputs, r.result.duration_s) for r in runs])

    run_cli(main)


# --- bench soak --------------------------------------------------------------------------


@bench_app.command("soak")
def soak_command(
    duration: Annotated[
        float, typer.Option("--duration", "-d", help="Seconds of traffic.")
    ] = 120.0,
    clients: Annotated[int, typer.Option("--clients", help="Concurrent clients.")] = 8,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help="A running server (default: start `servehall serve` in --workdir)."
        ),
    ] = None,
    config: ConfigOpt = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo/--no-demo",
            help="Serve the demo model (with --config: on top of it) when the soak starts "
            "the server.",
        ),
    ] = True,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key (or $OPENAI_API_KEY)."),
    ] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="The model field.")] = "demo",
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="max_tokens of the plain shapes.")
    ] = 8,
    seed: Seed = 0,
    schemas: Annotated[
        int, typer.Option("--schemas", help="JSON Schemas to generate with hypothesis.")
    ] = 150,
    faults: Annotated[
        list[str] | None,
        typer.Option(
            "--faults",
            help="worker-kill (SIGKILL the engine worker), worker-stop (SIGSTOP it for "
            "--fault-stop s), db-stop (SIGSTOP the PostgreSQL server as long), db-restart (restart "
            "it), redis-restart (run --redis-restart-cmd); repeat for several. 503s are "
            "allowed during each fault's window. Database faults need PostgreSQL.",
        ),
    ] = None,
    fault_stop: Annotated[
        float,
        typer.Option("--fault-stop", help="Seconds worker-stop and db-stop last."),
    ] = 5.0,
    db_pid: Annotated[
        int | None,
        typer.Option(
            "--db-pid",
            help="PostgreSQL postmaster pid for db-stop/db-restart (default: the parent "
            "of the database's pg_backend_pid(), on this machine).",
        ),
    ] = None,
    db_restart_cmd: Annotated[
        str | None,
        typer.Option(
            "--db-restart-cmd",
            help="Shell command for db-restart (default: pg_ctl restart -m fast on the "
            "postmaster's data directory, as its owner).",
        ),
    ] = None,
    redis_restart_cmd: Annotated[
        str | None,
        typer.Option(
            "--redis-restart-cmd", help="Shell command for redis-restart (required by it)."
        ),
    ] = None,
    fault_interval: Annotated[
        float | None,
        typer.Option("--fault-interval", help="Seconds between faults (default: spread evenly)."),
    ] = None,
    db_url: Annotated[
        str | None,
        typer.Option("--db-url", help="The database to check (default: the config's)."),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Where a started server runs (default: a temp dir)."),
    ] = None,
    pid: Annotated[
        list[int] | None,
        typer.Option("--pid", help="Server process(es) to sample RSS of, with --url."),
    ] = None,
    rss_bound: Annotated[
        float, typer.Option("--rss-bound-mib", help="Most RSS growth allowed (MiB).")
    ] = 512.0,
    output_json: OutputJson = None,
) -> None:
    """Accounting soak: every request shape (recorded client-library bodies, hostile
    inputs, generated schemas, client disconnects) from concurrent clients, optional
    faults, then invariants I1-I6 after a clean stop; exit 1 on any violation."""
    from servehall.bench.soak.faults import FAULTS
    from servehall.bench.soak.options import SoakError, SoakOptions, check_fault_options
    from servehall.bench.soak.run import run_soak

    def check() -> SoakOptions:
        if duration <= 0:
            raise UsageError(f"--duration must be positive (got {duration:g})")
        if clients < 1:
            raise UsageError(f"--clients must be at least 1 (got {clients})")
        if max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1 (got {max_tokens})")
        bad = [f for f in faults or [] if f not in FAULTS]
        if bad:
            raise UsageError(f"unknown fault {bad[0]!r}; known: {', '.join(FAULTS)}")
        if faults and url is not None:
            raise UsageError("--faults needs a server the soak starts (no --url)")
        if url is None and not demo and config is None:
            raise UsageError("give --url, --config or --demo")
        opts = SoakOptions(
            duration_s=duration,
            clients=clients,
            url=url,
            config=config,
            demo=demo and url is None,
            api_key=api_key,
            model=model,
            max_tokens=max_tokens,
            seed=seed,
            schemas=schemas,
            faults=tuple(faults or ()),
            fault_interval_s=fault_interval,
            fault_stop_s=fault_stop,
            db_pid=db_pid,
            db_restart_cmd=db_restart_cmd,
            redis_restart_cmd=redis_restart_cmd,
            db_url=db_url,
            workdir=workdir,
            pids=tuple(pid or ()),
            rss_bound_mib=rss_bound,
            output_json=output_json,
        )
        try:
            check_fault_options(opts)
        except SoakError as exc:
            raise UsageError(str(exc)) from None
        return opts

    opts = checked(check)

    async def main() -> int:
        from servehall.bench.soak.invariants import exit_status

        try:
            results = await run_soak(opts)
        except SoakError as exc:
            raise TargetError(str(exc)) from None
        return exit_status(results)

    code = run_cli(main)
    if code:
        raise typer.Exit(code)
