"""Default plugin: ``servehall db upgrade|status`` and ``servehall audit verify|query``."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from servehall.plugin.hookimpl import hookimpl

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]
T = TypeVar("T")

db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
audit_app = typer.Typer(help="Audit trail and request-log queries.", no_args_is_help=True)


def _with_engine(
    config: Path | None,
    fn: Callable[..., Awaitable[T]],
    *,
    create: bool = False,
    migrated: bool = True,
    with_settings: bool = False,
) -> T:
    """Load the deployment, open its database, run ``fn(engine, plugins)`` (with
    ``with_settings``: ``fn(engine, plugins, settings)``).

    On success prints ``database: URL (where the config came from)`` on stderr (stdout
    stays the command's output, e.g. CSV). Without ``create`` a SQLite file that does not
    exist is refused (connecting would create an empty one); with ``migrated`` a database
    that lacks the core's or an enabled plugin's revisions is refused with the command to
    run. Every failure — bad config, missing, un-migrated or unreachable database — is one
    ``error:`` line on stderr naming the database, and exit 2; never a traceback.
    """
    from servehall.db.engine import create_db_engine, database_url
    from servehall.db.locate import config_source, describe_database, require_existing_database
    from servehall.db.migrate import UPGRADE_HINT, pending_heads
    from servehall.errors import ConfigError, ServehallError
    from servehall.server.bootstrap import load_deployment

    where = ""

    async def go() -> T:
        nonlocal where
        settings, plugins = load_deployment(config)
        url = database_url(settings)
        where = describe_database(url)
        if not create:
            require_existing_database(url, config=config)
        engine = create_db_engine(settings)
        try:
            if migrated:
                missing = await pending_heads(
                    engine, plugins.migrations(), plugins.other_migrations()
                )
                if missing:
                    hint = f" --config {config}" if config is not None else ""
                    raise ConfigError(
                        f"database {where} is not migrated (missing: "
                        f"{', '.join(sorted(missing))}); run `{UPGRADE_HINT}{hint}`"
                    )
            result = await (fn(engine, plugins, settings) if with_settings else fn(engine, plugins))
        finally:
            await engine.dispose()
        typer.echo(f"database: {where} ({config_source(config)})", err=True)
        return result

    try:
        return asyncio.run(go())
    except ServehallError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # unreachable server, refused login, broken file …
        typer.echo(f"error: cannot use the database {where}: {_brief(exc)}", err=True)
        raise typer.Exit(2) from None


def _brief(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _version_heads(engine: Any) -> Awaitable[list[str]]:
    """The revisions in the database's ``alembic_version`` table (empty: never migrated)."""
    from alembic.runtime.migration import MigrationContext

    def heads(conn: Any) -> list[str]:
        return sorted(MigrationContext.configure(conn).get_current_heads())

    async def go() -> list[str]:
        async with engine.connect() as conn:
            result: list[str] = await conn.run_sync(heads)
            return result

    return go()


@db_app.command("upgrade")
def db_upgrade(config: ConfigOpt = None) -> None:
    """Migrate the database to the newest schema: the core's revisions and the branch of
    every enabled plugin (a disabled plugin's tables are left as they are), creating it if
    needed; says which revisions it was at before and is at now."""
    from servehall.db.migrate import pending_heads, upgrade_database

    async def go(engine: Any, plugins: Any) -> tuple[list[str], list[str], set[str]]:
        branches, known = plugins.migrations(), plugins.other_migrations()
        before = await _version_heads(engine)
        await upgrade_database(engine, branches, known)
        return before, await _version_heads(engine), await pending_heads(engine, branches, known)

    before, after, missing = _with_engine(config, go, create=True, migrated=False)
    if missing:  # pragma: no cover - upgrading to every target leaves nothing missing
        typer.echo(f"error: still missing {', '.join(sorted(missing))}", err=True)
        raise typer.Exit(1)
    if before == after:
        typer.echo(f"nothing to apply: the schema is up to date ({', '.join(after)})")
        return
    was = ", ".join(before) if before else "an empty database"
    typer.echo(f"migrated from {was} to {', '.join(after)}; the schema is up to date")


@db_app.command("status")
def db_status(config: ConfigOpt = None) -> None:
    """Show each migration branch (core and plugins) and whether it is applied; exit 1 when
    the core or an enabled plugin's branch is not (2 when the database does not exist or
    cannot be reached). Never creates a database. Then lists the quarantined records: the
    rows of ``record_rejected`` per sink and each configured sink's quarantine file that
    exists (``servehall-rejected-<sink>.jsonl`` next to its spill file, relative paths
    from the current directory)."""
    from servehall.db.migrate import branch_status
    from servehall.records.quarantine import count_rejected

    async def go(engine: Any, plugins: Any, settings: Any) -> tuple[Any, Any, Any]:
        rows = await branch_status(engine, plugins.migrations(), plugins.other_migrations())
        try:
            counts: dict[str, int] | None = await count_rejected(engine)
        except Exception:  # not migrated yet (or an older schema): no table to count
            counts = None
        return rows, counts, _quarantine_files(settings)

    rows, counts, files = _with_engine(config, go, migrated=False, with_settings=True)
    missing: list[str] = []
    for label, heads, applied, enabled in rows:
        state = "applied" if applied else "not applied"
        role = "core" if label == "servehall" else ("enabled" if enabled else "disabled")
        typer.echo(f"{label}: {', '.join(heads)} — {state} ({role})")
        if enabled and not applied:
            missing.extend(heads)
    if counts is not None:
        if counts:
            each = ", ".join(f"{sink}: {n}" for sink, n in sorted(counts.items()))
            typer.echo(f"quarantined records in record_rejected: {sum(counts.values())} ({each})")
        else:
            typer.echo("quarantined records in record_rejected: none")
    for path, n in files:
        typer.echo(f"quarantine file {path}: {n} record(s)")
    if missing:
        hint = f" --config {config}" if config is not None else ""
        typer.echo(
            f"not migrated (missing: {', '.join(sorted(missing))}); "
            f"run `servehall db upgrade{hint}`"
        )
        raise typer.Exit(1)
    typer.echo("schema is up to date")


def _quarantine_files(settings: Any) -> list[tuple[Path, int]]:
    """``(path, lines)`` of each configured sink's quarantine file that exists."""
    from servehall.records.quarantine import count_lines, quarantine_path

    out: list[tuple[Path, int]] = []
    for sink in settings.sinks:
        spill = sink.options.get("spill_path") or f"servehall-spill-{sink.name}.jsonl"
        path = quarantine_path(sink.name, str(spill))
        if path.exists():
            out.append((path, count_lines(path)))
    return out


@audit_app.command("verify")
def audit_verify(
    config: ConfigOpt = None,
    public_key: Annotated[
        Path | None,
        typer.Option(
            "--public-key",
            help="Ed25519 public key (PEM) to check the signed checkpoints with; "
            "default [audit] public_key.",
        ),
    ] = None,
) -> None:
    """Walk the audit_event hash chain, then check the signed checkpoints against it;
    exit 1 naming the first bad row or checkpoint."""
    from servehall.records.chain import verify_chain
    from servehall.records.checkpoint import load_public_key, verify_checkpoints

    async def go(engine: Any, plugins: Any, settings: Any) -> Any:
        chain = await verify_chain(engine)
        key_path = public_key or settings.audit.public_key
        if not chain.ok or key_path is None:
            return chain, None
        return chain, await verify_checkpoints(engine, load_public_key(key_path))

    chain, cps = _with_engine(config, go, with_settings=True)
    if not chain.ok:
        where = f"audit_event id {chain.bad_id}" if chain.bad_id is not None else "audit_event"
        typer.echo(f"FAILED: {where}: {chain.reason} ({chain.checked} row(s) verified)")
        raise typer.Exit(1)
    if cps is None:
        typer.echo(
            f"OK: {chain.checked} audit event(s), chain intact "
            "(signed checkpoints not checked: no --public-key or [audit] public_key)"
        )
        return
    if not cps.ok:
        where = (
            f"audit_checkpoint id {cps.bad_checkpoint}"
            if cps.bad_checkpoint is not None
            else "audit_checkpoint"
        )
        typer.echo(
            f"FAILED: {where}: {cps.reason} ({chain.checked} row(s) chained, "
            f"{cps.checked} checkpoint(s) verified)"
        )
        raise typer.Exit(1)
    typer.echo(
        f"OK: {chain.checked} audit event(s), chain intact, {cps.checked} signed "
        f"checkpoint(s) verified; {cps.unsigned} event(s) after the last checkpoint unsigned"
    )


@audit_app.command("keygen")
def audit_keygen(
    private_key: Annotated[
        Path, typer.Argument(help="Where to write the Ed25519 private key (PEM, mode 0600).")
    ],
    public_key: Annotated[
        Path | None,
        typer.Option("--public-key", help="Where to write the public key; default PRIVATE.pub."),
    ] = None,
) -> None:
    """Write a new Ed25519 key pair for [audit] signing_key / public_key (refuses to
    overwrite an existing file)."""
    import os

    from servehall.records.checkpoint import generate_keypair

    pub_path = public_key or private_key.with_name(private_key.name + ".pub")
    for path in (private_key, pub_path):
        if path.exists():
            typer.echo(f"error: {path} exists; not overwritten", err=True)
            raise typer.Exit(2)
    private, public = generate_keypair()
    fd = os.open(private_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    pub_path.write_bytes(public)
    typer.echo(f"private key: {private_key} (keep it out of the database and the config)")
    typer.echo(f"public key:  {pub_path}")
    typer.echo(public.decode().strip())


FLOAT_DECIMALS = 6
"""Decimals ``audit query`` prints for floats (seconds to the microsecond, shares to
1e-6), in every format: the databases' percentile and ratio arithmetic leaves 17-digit
noise such as ``0.30000000000000004``."""


def _tidy(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, FLOAT_DECIMALS)
    return value


def _render(cols: list[str], rows: list[dict[str, Any]], fmt: str) -> str:
    rows = [{k: _tidy(v) for k, v in row.items()} for row in rows]
    if fmt == "json":
        return json.dumps(rows, indent=2, ensure_ascii=False, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow(
                {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()}
            )
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for c in cols:
        table.add_column(c)
    for row in rows:
        table.add_row(*("" if row[c] is None else str(row[c]) for c in cols))
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


@audit_app.command("query")
def audit_query(
    name: Annotated[
        str,
        typer.Argument(
            help="requests_per_tenant_day | error_rate_by_status | latency_by_model | audit_events"
        ),
    ],
    since: Annotated[
        str | None, typer.Option("--since", help="YYYY-MM-DD or ISO-8601 time (UTC).")
    ] = None,
    fmt: Annotated[
        Literal["table", "csv", "json"], typer.Option("--format", help="Output format.")
    ] = "table",
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many rows.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run one of the documented SQL views (see docs/sql.md) and print its rows."""
    from servehall.errors import ServehallError
    from servehall.records.queries import find_query, parse_since, run_query

    try:
        find_query(name)
        when = parse_since(since) if since else None
    except ServehallError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def go(engine: Any, plugins: Any) -> tuple[list[str], list[dict[str, Any]]]:
        return await run_query(engine, name, when, limit)

    cols, rows = _with_engine(config, go)
    typer.echo(_render(cols, rows, fmt), nl=False)


@hookimpl
def servehall_register_commands(cli: typer.Typer) -> None:
    cli.add_typer(db_app, name="db")
    cli.add_typer(audit_app, name="audit")
