"""``servehall config apply|history|rollback``: config revisions in the database.

Each command opens the deployment's database (``--config``: the running deployment's
config file). ``apply`` and ``rollback`` store a new revision (audited in the hash
chain as ``config.applied`` / ``config.rollback``, actor ``cli:<OS user>``); every
replica running with ``[server] config_revisions = true`` applies it live within its
``config_poll_s`` (docs/versions.md). A revision never holds a literal secret: it is
stored as ``{ redacted = true }`` (:mod:`servehall.config.redact`) and each replica
takes it from its running config when it applies the revision. Both keep a canary the
guard rolled back at weight 0 unless the stored config sets its weight
(:mod:`servehall.rollout.sticky`), and say so.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from servehall.defaults.records_commands import ConfigOpt, _with_engine


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def _require_revisions(settings_enabled: bool) -> None:
    from servehall.errors import ConfigError

    if not settings_enabled:
        raise ConfigError(
            "[server] config_revisions is off in this deployment's config: replicas do "
            "not follow revisions (send SIGHUP to a server to re-read its file instead)"
        )


def _keep_rollbacks(text: str, fmt: str, newest: Any) -> str:
    """``text`` with the guard's rollbacks in ``newest`` (a stored revision, or None)
    kept (:func:`servehall.rollout.sticky.keep`); each kept one is named on stderr."""
    from servehall.config.settings import parse_config_text
    from servehall.rollout import sticky

    if newest is None:
        return text
    previous = parse_config_text(newest.text, newest.fmt).get("models") or []
    text, kept = sticky.keep(text, fmt, previous)
    for key in kept:
        typer.echo(
            f"{key}: kept at weight 0 (rolled back by the canary guard in revision "
            f"{newest.revision}); set its weight to change it",
            err=True,
        )
    return text


async def _announce(settings: Any, revision: int) -> None:
    """Announce ``revision`` over ``[server] config_broadcast_url`` when set."""
    from servehall.rollout.broadcast import announce_url

    url = settings.server.config_broadcast_url
    if url is not None:
        await announce_url(url.get_secret_value(), revision)


def config_apply(
    file: Annotated[Path, typer.Argument(help="The new config file.")],
    config: ConfigOpt = None,
) -> None:
    """Validate FILE (every error in one run, as `config check`), refuse settings that
    cannot change live, then store it as the next revision (literal secrets redacted);
    replicas apply it live."""
    from servehall.config.check import check_config
    from servehall.config.redact import redact_text
    from servehall.config.settings import config_format, parse_config_text
    from servehall.rollout import revisions
    from servehall.rollout.live import non_live_changes
    from servehall.server.bootstrap import load_deployment

    errors = check_config(file)
    fmt = config_format(file)
    text = ""
    if not errors:
        settings, _ = load_deployment(config)
        _require_revisions(settings.server.config_revisions)
        text = redact_text(file.read_text(encoding="utf-8"), fmt, load_deployment(file)[0])

    async def go(engine: Any, plugins: Any) -> Any:
        newest = await revisions.latest(engine)
        stored = _keep_rollbacks(text, fmt, newest)
        if newest is not None:
            errs = non_live_changes(
                parse_config_text(newest.text, newest.fmt), parse_config_text(stored, fmt)
            )
            if errs:
                return errs
            if newest.hash == revisions.text_hash(stored):
                return newest
        rev = await revisions.record(engine, stored, fmt, _actor())
        await _announce(settings, rev.revision)
        return rev

    if not errors:
        result = _with_engine(config, go)
        if isinstance(result, list):
            errors = result
    if errors:
        for key, msg in errors:
            typer.echo(f"{file}: {key}: {msg}", err=True)
        typer.echo(f"{file}: {len(errors)} error(s); nothing applied", err=True)
        raise typer.Exit(1)
    typer.echo(f"revision {result.revision} ({result.hash[:12]}): replicas apply it live")


def config_history(
    config: ConfigOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Newest N.")] = 20,
    diff: Annotated[bool, typer.Option("--diff", help="Print each revision's diff.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines.")] = False,
) -> None:
    """List applied config revisions, newest first: revision, when, who, hash, +/- lines;
    and the configs a replica refused (a new version failed to start, its probe or its
    accuracy gate: audit events ``config.refused``), marked ``refused`` with the first
    error."""
    from servehall.rollout import revisions

    async def go(
        engine: Any, plugins: Any
    ) -> tuple[list[revisions.Revision], list[revisions.Refusal]]:
        return await revisions.history(engine, limit), await revisions.refusals(engine, limit)

    rows, refused = _with_engine(config, go)
    entries: list[tuple[Any, Any]] = [(r.applied_at, r) for r in rows]
    entries += [(f.at, f) for f in refused]
    entries.sort(key=lambda e: e[0], reverse=True)
    for _, r in entries[:limit]:
        if isinstance(r, revisions.Refusal):
            _print_refusal(r, as_json)
            continue
        lines = r.diff.splitlines()
        plus = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
        minus = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
        if as_json:
            out = {
                "revision": r.revision,
                "applied_at": r.applied_at.isoformat(),
                "applied_by": r.applied_by,
                "hash": r.hash,
                "added_lines": plus,
                "removed_lines": minus,
            }
            if diff:
                out["diff"] = r.diff
            typer.echo(json.dumps(out))
            continue
        when = r.applied_at.strftime("%Y-%m-%d %H:%M:%S")
        typer.echo(f"{r.revision:>5}  {when}  {r.applied_by:<24} {r.hash[:12]}  +{plus} -{minus}")
        if diff and r.diff:
            typer.echo(r.diff.rstrip("\n"))
    if not rows and not refused:
        typer.echo("no config revisions recorded", err=True)


def _print_refusal(r: Any, as_json: bool) -> None:
    """One ``config.refused`` event as a history line (or JSON line: ``refused: true``,
    ``revision`` (None for a direct apply), ``at``, ``by``, ``replica``, ``errors``,
    ``gates``)."""
    d = r.details
    errors = d.get("errors") or []
    if as_json:
        out = {
            "refused": True,
            "revision": d.get("revision"),
            "at": r.at.isoformat(),
            "by": r.actor,
            "replica": d.get("replica"),
            "errors": errors,
            "gates": d.get("gates") or {},
        }
        typer.echo(json.dumps(out))
        return
    when = r.at.strftime("%Y-%m-%d %H:%M:%S")
    what = r.target if r.target.startswith("revision") else "direct apply"
    first = f"{errors[0][0]}: {errors[0][1]}" if errors else ""
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    typer.echo(f"refused  {when}  {r.actor:<24} {what} on {d.get('replica', '?')}: {first}{more}")


def config_rollback(
    revision: Annotated[
        int | None, typer.Argument(help="Revision to return to (default: the previous one).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Apply an earlier revision again, the same live way (stored as a new revision,
    audited as ``config.rollback``). Refused, naming each field, when the revision has a
    redacted secret in a ``[[models]]`` entry that the newest revision does not have
    (the replicas could not know it)."""
    from servehall.config.redact import restore_secrets
    from servehall.config.settings import parse_config_text
    from servehall.errors import ConfigError
    from servehall.rollout import revisions
    from servehall.server.bootstrap import load_deployment

    settings, _ = load_deployment(config)
    _require_revisions(settings.server.config_revisions)

    async def go(engine: Any, plugins: Any) -> tuple[revisions.Revision, int]:
        newest = await revisions.latest(engine)
        if newest is None:
            raise ConfigError("no config revisions recorded: nothing to roll back to")
        target_no = revision if revision is not None else newest.revision - 1
        target = await revisions.get(engine, target_no) if target_no >= 1 else None
        if target is None:
            raise ConfigError(f"no config revision {target_no} (newest: {newest.revision})")
        models = parse_config_text(target.text, target.fmt).get("models", [])
        running = parse_config_text(newest.text, newest.fmt).get("models", [])
        try:
            restore_secrets({"models": models}, {"models": running})
        except ConfigError as exc:
            lines = "\n".join(f"  {k}: {m}" for k, m in exc.errors)
            raise ConfigError(
                f"revision {target.revision} cannot be rolled back to: the running config "
                f"does not have its secrets:\n{lines}",
                exc.errors,
            ) from None
        rev = await revisions.record(
            engine,
            _keep_rollbacks(target.text, target.fmt, newest),
            target.fmt,
            _actor(),
            action="config.rollback",
            details={"to": target.revision, "from": newest.revision},
        )
        await _announce(settings, rev.revision)
        return rev, target.revision

    rev, to = _with_engine(config, go)
    typer.echo(f"revision {rev.revision} = revision {to} ({rev.hash[:12]}): replicas apply it live")
