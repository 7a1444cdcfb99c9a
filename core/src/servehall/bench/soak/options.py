"""The options of a soak run (:class:`SoakOptions`) and the checks made on them before
it starts: the faults asked for must be ones this deployment can have."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servehall.bench.soak.faults import STOP_S, FaultError, check_faults, redis_urls


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
    embed_model: str | None = None
    embed_path: Path | None = None
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
    api_processes: int = 1
    """``[server] api_processes`` of a server the soak starts (1: no frontend
    processes); also what ``api-kill`` needs (at least 2)."""


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
    if opts.api_processes < 1:
        raise SoakError(f"--api-processes must be at least 1 (got {opts.api_processes})")
    if opts.api_processes > 1 and opts.url is not None:
        raise SoakError("--api-processes is for a server the soak starts (no --url)")
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
            api_processes=opts.api_processes,
        )
    except FaultError as exc:
        raise SoakError(str(exc)) from None
