"""``servehall bench soak``: the command (Typer), registered on
:data:`servehall.bench.cli.bench_app`. Its options become one
:class:`~servehall.bench.soak.options.SoakOptions` (a bad value: one line, exit status 2),
then :func:`~servehall.bench.soak.run.run_soak` runs and the invariants give the exit
status (1 on any violation)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servehall.bench.client import TargetError
from servehall.bench.options import (
    ConfigOpt,
    OutputJson,
    Seed,
    UsageError,
    checked,
    run_cli,
)


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
    embed_model: Annotated[
        str | None,
        typer.Option(
            "--embed-model",
            help="An embedding model the server serves: adds /v1/embeddings traffic.",
        ),
    ] = None,
    embed_path: Annotated[
        Path | None,
        typer.Option(
            "--embed-path",
            help="A started server (no --config) also serves this model directory for "
            'embedding (as --embed-model, default "embed").',
        ),
    ] = None,
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
            help="worker-kill (SIGKILL the engine worker), api-kill (SIGKILL one HTTP "
            "frontend process; needs --api-processes 2 or more), worker-stop (SIGSTOP it for "
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
    api_processes: Annotated[
        int,
        typer.Option(
            "--api-processes",
            help="[server] api_processes of the server the soak starts: N HTTP frontend "
            "processes in front of the serve process (api-kill needs 2 or more).",
        ),
    ] = 1,
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
        if api_processes < 1:
            raise UsageError(f"--api-processes must be at least 1 (got {api_processes})")
        if api_processes > 1 and url is not None:
            raise UsageError("--api-processes is for a server the soak starts (no --url)")
        if faults and url is not None:
            raise UsageError("--faults needs a server the soak starts (no --url)")
        if url is None and not demo and config is None:
            raise UsageError("give --url, --config or --demo")
        if embed_path is not None and (url is not None or config is not None):
            raise UsageError(
                "--embed-path is for a server the soak configures (no --url or --config)"
            )
        if embed_path is not None and not embed_path.is_dir():
            raise UsageError(f"--embed-path {embed_path} is not a directory")
        opts = SoakOptions(
            duration_s=duration,
            clients=clients,
            url=url,
            config=config,
            demo=demo and url is None,
            api_key=api_key,
            model=model,
            embed_model=embed_model,
            embed_path=embed_path,
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
            api_processes=api_processes,
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
