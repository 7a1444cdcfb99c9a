"""``servehall keys …``: create, list, revoke and rotate API keys from the command line.

All commands take ``--config`` (default ``$SERVEHALL_CONFIG``) and use the deployment's
database and ``[auth] pepper``. ``create`` and ``rotate`` print the key exactly once (to
stdout; everything else goes to stderr) — store it then, it cannot be shown again.
Every operation is an audit event with actor ``cli:<OS user>``, written through the
deployment's record bus (the same sinks ``serve`` uses, so it lands in ``audit_event``).

Times: ``--expires`` takes an ISO 8601 date (``2027-01-31`` = 00:00 UTC that day) or
date-time (naive = UTC), or a duration from now such as ``30d``, ``12h``, ``90m``.
``--overlap`` takes a duration (``0``, ``300s``, ``15m``, ``1h``, ``7d``).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from servehall import ConfigError
from servehall_auth.settings import PRIORITY_LIMIT

keys_app = typer.Typer(help="Manage API keys (auth plugin).", no_args_is_help=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]

_DUR = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``"90"``/``"90s"``, ``"15m"``, ``"2h"``, ``"7d"`` → timedelta. ValueError otherwise."""
    m = _DUR.match(text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 300s, 15m, 2h, 7d)")
    return timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])


def parse_expires(text: str, now: datetime | None = None) -> datetime:
    """An expiry instant (UTC) from a date, a date-time or a duration from now."""
    now = now or datetime.now(UTC)
    if _DUR.match(text.strip()) and text.strip()[-1:] in "smhd":
        return now + parse_duration(text)
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not a date, date-time or duration: {text!r}") from None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def _split(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    return out


def _fail(msg: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(code)


class _Session:
    """Settings, key store and record bus of one CLI invocation."""

    def __init__(self, config: Path | None) -> None:
        from servehall import PluginError, load_deployment
        from servehall_auth.settings import AuthSettings

        try:
            self.settings, self.plugins = load_deployment(config)
        except (ConfigError, PluginError) as exc:
            raise _fail(exc.message, 2) from None
        auth = self.settings.section("auth")
        if not isinstance(auth, AuthSettings):
            raise _fail("the auth plugin is not enabled in [plugins] enabled", 2)
        if not auth.api_keys or auth.pepper is None:
            raise _fail("API keys are disabled ([auth] api_keys = false)", 2)
        self.auth = auth
        self.actor = f"cli:{_os_user()}"
        self.redis: Any = None  # redis.asyncio.Redis when [auth] limits_url is set
        self.url = (auth.database_url or self.settings.database.url).get_secret_value()
        self._check_databases(config)

    def _check_databases(self, config: Path | None) -> None:
        """Refuse a SQLite file that does not exist (a connect would create an empty one)
        before anything opens it. (The database is named on stderr once it is open.)"""
        from servehall import describe_database, require_existing_database

        self.where = describe_database(self.url)
        core = self.settings.database.url.get_secret_value()
        try:
            for url in dict.fromkeys((self.url, core)):
                require_existing_database(url, config=config)
        except ConfigError as exc:
            raise _fail(exc.message, 2) from None

    async def __aenter__(self) -> _Session:
        """Open the record bus first (no audit trail, no change), then the key store."""
        from servehall import ConfigError, DbTimeouts, open_record_bus
        from servehall_auth.store import KeyStore, make_engine

        try:
            self.bus = await open_record_bus(self.settings, self.plugins)
        except ConfigError as exc:
            raise _fail(f"cannot record audit events, nothing changed: {exc.message}", 2) from None
        except Exception as exc:  # an unreachable database: one line, no traceback
            raise _fail(
                f"cannot record audit events in {self.where}, nothing changed: {_brief(exc)}", 2
            ) from None
        assert self.auth.pepper is not None
        try:
            engine = make_engine(self.url, DbTimeouts.of(self.settings))
            self.keys = KeyStore(engine, self.auth.pepper.get_secret_value())
            await self.keys.check_schema()
        except ConfigError as exc:
            await self._close()
            raise _fail(f"database {self.where}: {exc.message}", 2) from None
        except Exception as exc:
            await self._close()
            raise _fail(f"cannot use the database {self.where}: {_brief(exc)}", 2) from None
        if self.auth.limits_url is not None:
            # revoke/rotate reach every replica's key cache at once (pub/sub)
            from servehall_auth.broadcast import publish_key_change
            from servehall_auth.redis_limiter import make_client

            client = make_client(self.auth.limits_url.get_secret_value(), 2.0)
            self.redis = client

            async def publish(key_id: str) -> None:
                await publish_key_change(client, key_id)

            self.keys.on_change = publish
        typer.echo(f"database: {self.where}", err=True)
        return self

    def audit(self, action: str, target: str | None, details: dict[str, Any]) -> None:
        """Queue an audit event on the record bus (written when the session closes)."""
        from servehall import AuditEvent

        self.bus.audit(
            AuditEvent(
                action=action,
                actor=self.actor,
                target=target,
                details=details,
                at=datetime.now(UTC),
            )
        )

    async def _close(self) -> None:
        try:
            await self.bus.close()
        finally:
            if getattr(self, "keys", None) is not None:
                await self.keys.engine.dispose()
            if self.redis is not None:
                await self.redis.aclose()

    async def __aexit__(self, *exc: object) -> None:
        await self._close()


def _brief(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


#: How the record printout shows a field that is not set (JSON keeps ``null``).
_UNSET = {
    "models": "* (every model)",
    "rpm": "[auth] default",
    "tpm": "[auth] default",
    "priority": "the tenant's",
    "max_priority": "the tenant's",
    "expires_at": "never",
}


def _shown(key: str, value: Any) -> str:
    if value is None:
        return _UNSET.get(key, "-")
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _print_record(rec: dict[str, Any], as_json: bool) -> None:
    """The key record on stderr (``name: value``; unset values in words, never ``None``),
    or as JSON on stdout."""
    if as_json:
        typer.echo(json.dumps(rec, indent=2))
        return
    for k, v in rec.items():
        if k == "key":
            continue
        if v is None and k not in _UNSET:
            continue  # e.g. no name, never revoked: nothing to say
        typer.echo(f"{k:>28}: {_shown(k, v)}", err=True)


def _print_new_secret(rec: dict[str, Any], key: str, as_json: bool, notice: str) -> None:
    """Print a key record with its new secret (shown this once): JSON with a ``key``
    field, or the record, ``notice`` on stderr and the bare key on stdout."""
    if as_json:
        typer.echo(json.dumps({**rec, "key": key}, indent=2))
    else:
        _print_record(rec, False)
        typer.echo(notice, err=True)
        typer.echo(key)


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant the key belongs to.")],
    name: Annotated[str | None, typer.Option("--name", help="A label for the key.")] = None,
    scopes: Annotated[
        list[str] | None,
        typer.Option("--scopes", help="Scopes (repeat or comma-separate); default inference."),
    ] = None,
    models: Annotated[
        list[str] | None,
        typer.Option("--models", help="Allowed models (repeat or comma-separate); default all."),
    ] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=1, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=1, help="Tokens per minute.")] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            min=-PRIORITY_LIMIT,
            max=PRIORITY_LIMIT,
            help="Scheduling priority of the key's requests (policy priority; "
            "default: the tenant's).",
        ),
    ] = None,
    max_priority: Annotated[
        int | None,
        typer.Option(
            "--max-priority",
            min=-PRIORITY_LIMIT,
            max=PRIORITY_LIMIT,
            help="Highest priority a request may ask for (default: the tenant's).",
        ),
    ] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", help="Expiry: 2027-01-31, ISO date-time, or 30d.")
    ] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key and print it once (stdout). Store it now: it cannot be shown again."""
    try:
        expires_at = parse_expires(expires) if expires else None
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    scope_list = _split(scopes) or ["inference"]
    model_list = _split(models)
    session = _Session(config)

    async def run() -> tuple[dict[str, Any], str]:
        from servehall_auth.store import AUDITED_KEY_FIELDS

        async with session as s:
            rec, key = await s.keys.create(
                tenant=tenant,
                name=name,
                scopes=scope_list,
                models=model_list,
                rpm=rpm,
                tpm=tpm,
                expires_at=expires_at,
                created_by=s.actor,
                priority=priority,
                max_priority=max_priority,
            )
            d = rec.as_dict()
            fields = {k: d[k] for k in AUDITED_KEY_FIELDS}
            s.audit("key.created", rec.public_id, fields)
            return d, key

    rec, key = asyncio.run(run())
    _print_new_secret(rec, key, as_json, "Store this key now; it will not be shown again:")


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (ids and settings; never secrets)."""
    session = _Session(config)

    async def run() -> list[dict[str, Any]]:
        async with session as s:
            recs = await s.keys.list(tenant=tenant, include_revoked=show_all)
            s.audit(
                "key.listed",
                None,
                {"tenant": tenant, "include_revoked": show_all, "count": len(recs)},
            )
            return [r.as_dict() for r in recs]

    rows = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_key_table(rows)


WIDE_CONSOLE_COLUMNS = 1000
"""Console width for ``keys list`` when stdout is not a terminal (pipe, file, CI log):
wide enough that no row is wrapped, so each key's id can be copied from the output."""


def _print_key_table(rows: list[dict[str, Any]]) -> None:
    """The ``keys list`` table on stdout. Values an operator copies (id, tenant, name,
    expiry) are never cut with "…": the id is never wrapped and every column folds
    instead of truncating; when stdout is not a terminal the console is
    :data:`WIDE_CONSOLE_COLUMNS` wide (rich would otherwise assume 80 columns)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=WIDE_CONSOLE_COLUMNS)
    t = Table(title="API keys")
    longest_id = max((len(r["id"]) for r in rows), default=2)
    t.add_column("id", no_wrap=True, min_width=longest_id, overflow="fold")
    for col in ("tenant", "name", "scopes", "models", "rpm", "tpm", "expires", "status"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(
            r["id"],
            r["tenant"],
            r["name"] or "",
            ",".join(r["scopes"]),
            ",".join(r["models"]) if r["models"] is not None else "*",
            str(r["rpm"] or ""),
            str(r["tpm"] or ""),
            r["expires_at"] or "",
            r["status"],
        )
    console.print(t)


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="Key id: sh-<id> (as in `keys list`).")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key at once (servers notice within [auth] key_cache_ttl_s)."""
    from servehall_auth.store import KeyNotFoundError

    session = _Session(config)

    async def run() -> dict[str, Any]:
        async with session as s:
            rec = await s.keys.revoke(key_id.removeprefix("sh-"))
            s.audit("key.revoked", rec.public_id, {})
            return rec.as_dict()

    try:
        rec = asyncio.run(run())
    except KeyNotFoundError:
        raise _fail(f"no key {key_id}") from None
    _print_record(rec, as_json)
    if not as_json:
        typer.echo(f"revoked {rec['id']}", err=True)


@keys_app.command("rotate")
def rotate(
    key_id: Annotated[str, typer.Argument(help="Key id: sh-<id>.")],
    overlap: Annotated[
        str, typer.Option("--overlap", help="How long the old secret keeps working (e.g. 1h).")
    ] = "0",
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give a key a new secret (same id, tenant, scopes, models, limits); print it once."""
    from servehall_auth.store import KeyNotFoundError

    try:
        window = parse_duration(overlap)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    session = _Session(config)

    async def run() -> tuple[dict[str, Any], str]:
        async with session as s:
            rec, key = await s.keys.rotate(key_id.removeprefix("sh-"), window)
            s.audit("key.rotated", rec.public_id, {"overlap_s": window.total_seconds()})
            return rec.as_dict(), key

    try:
        rec, key = asyncio.run(run())
    except KeyNotFoundError:
        raise _fail(f"no key {key_id}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    _print_new_secret(rec, key, as_json, "Store the new key now; it will not be shown again:")
