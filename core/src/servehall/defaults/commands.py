"""Default plugin: the core's CLI commands (``serve``, ``plugins``, ``config``, ``demo-model``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servehall.errors import ServehallError
from servehall.hookimpl import hookimpl
from servehall.plugins import PluginHost

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]


def plugins_command(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List installed plugins, their hooks, whether enabled, and backend probe results."""
    from servehall.bootstrap import load_deployment

    _, host = load_deployment(config, load_all=True)
    data = {"plugins": host.describe(), "backends": _all_backends(host)}
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = Console()
    t = Table(title="plugins")
    for col in ("name", "distribution", "version", "enabled", "status", "hooks"):
        t.add_column(col, overflow="fold")
    for p in data["plugins"]:
        status = "error: " + p["error"] if p["error"] else ("loaded" if p["loaded"] else "-")
        t.add_row(
            p["name"],
            p["distribution"] or "(core)",
            p["version"] or "",
            "default" if p["default"] else ("yes" if p["enabled"] else "no"),
            status,
            ", ".join(h.removeprefix("servehall_") for h in p["hooks"]),
        )
    console.print(t)
    b = Table(title="backends")
    for col in ("name", "plugin", "enabled", "available", "reason"):
        b.add_column(col, overflow="fold")
    for be in data["backends"]:
        b.add_row(
            be["name"],
            be["plugin"] or "",
            "yes" if be["enabled"] else "no",
            "yes" if be["available"] else "no",
            be["reason"],
        )
    console.print(b)


def _all_backends(host: PluginHost) -> list[dict[str, Any]]:
    """Every installed backend with its probe, and whether its plugin is enabled here.

    Backends of plugins that are installed but not enabled are probed too (through a
    second host that enables every plugin that imports), so an operator sees what
    enabling them would give."""
    importable = [i.name for i in host.infos.values() if not i.default and not i.error]
    try:
        everything = PluginHost(importable)
    except ServehallError:
        everything = host
    enabled = {i.name for i in host.infos.values() if i.enabled}
    rows = everything.backends().describe()
    for row in rows:
        row["enabled"] = row["plugin"] in enabled
    return rows


config_app = typer.Typer(help="Validate and show configuration.", no_args_is_help=True)


@config_app.command("check")
def config_check(file: Annotated[Path, typer.Argument(help="Config file to validate.")]) -> None:
    """Validate FILE without starting: core types, plugin names and sections, and every
    policy/sink/backend name. Prints every problem in one run; exit 1 on errors."""
    from servehall.config.check import check_config

    errors = check_config(file)
    for key, msg in errors:
        typer.echo(f"{file}: {key}: {msg}", err=True)
    if errors:
        typer.echo(f"{file}: {len(errors)} error(s)", err=True)
        raise typer.Exit(1)
    typer.echo(f"{file}: OK")


@config_app.command("show")
def config_show(config: ConfigOpt = None) -> None:
    """Print the effective config (file + environment + defaults) as JSON, secrets masked
    (database URLs are shown with their password hidden)."""
    from servehall.bootstrap import load_deployment
    from servehall.config.settings import masked_dump

    settings, _ = load_deployment(config)
    typer.echo(json.dumps(masked_dump(settings), indent=2, default=str))


def serve_command(
    config: ConfigOpt = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Serve the demo model (built on first use).")
    ] = False,
    bind: Annotated[
        list[str] | None, typer.Option("--bind", "-b", help="host:port (repeatable).")
    ] = None,
) -> None:
    """Start the HTTP server (HTTP/1.1, h2c, and TLS h2 when configured)."""
    from servehall.server import serve

    serve(config=config, demo=demo, bind=bind)


def demo_model_command(
    out: Annotated[Path | None, typer.Option("--out", help="Output directory.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if present.")] = False,
) -> None:
    """Build the small local demo model (Llama-style, random weights, local tokenizer)."""
    from servehall.demo import DEFAULT_DEMO_DIR, build_demo_model

    path = build_demo_model(out or DEFAULT_DEMO_DIR, force=force)
    typer.echo(str(path))


@hookimpl
def servehall_register_commands(cli: typer.Typer) -> None:
    cli.command("serve")(serve_command)
    cli.command("plugins")(plugins_command)
    cli.add_typer(config_app, name="config")
    cli.command("demo-model")(demo_model_command)
