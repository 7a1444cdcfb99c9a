"""``servehall bench serve | engine | compare | soak`` (Typer), registered by the core's
``servehall.defaults.commands``; the options and the failure handling they share are in
:mod:`servehall.bench.options`.

Every failure the user can cause (an unreachable URL, a refused key, an unknown model,
``--num-requests 0``, an unknown dataset, a missing file) ends with one line on stderr
(``error: ...``) and exit status 1 (target failures) or 2 (bad arguments).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from servehall.bench.options import (
    Burstiness,
    Concurrency,
    ConfigOpt,
    Dataset,
    DatasetPath,
    EndpointOpt,
    IgnoreEos,
    InputLen,
    NumRequests,
    OutputJson,
    OutputLen,
    PlotOpt,
    Quiet,
    RangeRatio,
    RequestRate,
    ResponseFormat,
    Seed,
    Slo,
    UsageError,
    checked,
    finish_run,
    load_tokenizer_or_fail,
    run_cli,
    workload_from,
)
from servehall.bench.report import make_console
from servehall.bench.soak.cli import soak_command

bench_app = typer.Typer(
    help="Measure a server, an engine, or several side by side (vLLM's benchmark metrics).",
    no_args_is_help=True,
)


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
            "launch:h1 | vllm-server:MODEL (vLLM's own server); launch: and vllm-server: take "
            ",api=N (N API processes); ratios are against the first."
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
    api_processes: Annotated[
        str | None,
        typer.Option(
            "--api-processes",
            help="e.g. 1,2,4: run every launch: and vllm-server: target once per count of "
            "API processes (servehall [server] api_processes, vLLM --api-server-count).",
        ),
    ] = None,
    output_json: OutputJson = None,
    plot: PlotOpt = None,
    quiet: Quiet = False,
) -> None:
    """Run several targets on the same workload, one after the other; print ratios against
    the first and CPU per token (frontend CPU = server CPU − engine CPU)."""
    options = dict(locals())  # the command line, before any other local
    from servehall.bench.compare import expand_api_processes, parse_target
    from servehall.bench.processes import parse_api_processes

    spec = checked(lambda: workload_from(options))

    def parse_all() -> list[Any]:
        if not targets:
            raise UsageError("give at least one target")
        try:
            counts = parse_api_processes(api_processes) if api_processes is not None else []
        except ValueError as exc:
            raise UsageError(f"--api-processes: {exc}") from None
        try:
            parsed = [parse_target(t) for t in expand_api_processes(targets, counts)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if any(t.kind in ("engine", "launch", "vllm-server") for t in parsed) and config is None:
            raise UsageError("engine:, launch: and vllm-server: targets need --config FILE")
        return parsed

    parsed = checked(parse_all)

    async def main() -> None:
        from contextlib import ExitStack

        from servehall.bench.compare import comparison_rows, run_labels, run_target
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
            if any(t.kind == "launch" and t.api_processes is None for t in parsed):
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
                    "summaries": {
                        label: r.summary.as_dict()
                        for r, label in zip(runs, run_labels(runs), strict=True)
                    },
                },
            )
        if plot is not None:
            from servehall.bench.plot import plot_runs

            labels = run_labels(runs)
            plot_runs(
                plot,
                [
                    (lb, r.result.outputs, r.result.duration_s)
                    for r, lb in zip(runs, labels, strict=True)
                ],
            )

    run_cli(main)


# --- bench soak (its options and checks are the soak's: servehall.bench.soak.cli) ---

bench_app.command("soak")(soak_command)
