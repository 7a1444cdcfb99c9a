"""Default plugin: the core's CLI commands (``serve``, ``plugins``, ``config``, ``demo-model``,
``bench``, ``batch``, ``models``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from servehall.defaults import config_commands
from servehall.errors import ServehallError
from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.manager import PluginHost

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]


def plugins_command(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List installed plugins, their hooks, whether enabled, and backend probe results.

    Also says which plugins 'serve --demo' enables on top of the config.
    """
    from servehall.server.bootstrap import load_deployment
    from servehall.server.serve import demo_enables

    settings, host = load_deployment(config, load_all=True)
    data: dict[str, Any] = {
        "plugins": host.describe(),
        "backends": _all_backends(host),
        "demo_enables": demo_enables(settings),
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from servehall.cli.tables import print_table

    console = Console()
    print_table(
        console,
        "plugins",
        ("name", "distribution", "version", "enabled", "status", "hooks"),
        [
            (
                p["name"],
                p["distribution"] or "(core)",
                p["version"] or "",
                "default" if p["default"] else ("yes" if p["enabled"] else "no"),
                "error: " + p["error"] if p["error"] else ("loaded" if p["loaded"] else "-"),
                ", ".join(h.removeprefix("servehall_") for h in p["hooks"]),
            )
            for p in data["plugins"]
        ],
        no_wrap=("name", "distribution", "version", "enabled"),
    )
    print_table(
        console,
        "backends",
        ("name", "plugin", "enabled", "available", "reason"),
        [
            (
                be["name"],
                be["plugin"] or "",
                "yes" if be["enabled"] else "no",
                "yes" if be["available"] else "no",
                be["reason"],
            )
            for be in data["backends"]
        ],
        no_wrap=("name", "plugin", "enabled", "available"),
    )
    if data["demo_enables"]:
        console.print(
            Text(
                "`servehall serve --demo` also enables "
                + ", ".join(data["demo_enables"])
                + " for that run (not listed as enabled above, which is the config's "
                "[plugins] enabled); add it there to enable it for every run."
            )
        )


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


config_app = typer.Typer(
    help="Validate, show and apply configuration (revisions, rollback).", no_args_is_help=True
)


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
    from servehall.config.settings import masked_dump
    from servehall.server.bootstrap import load_deployment

    settings, _ = load_deployment(config)
    typer.echo(json.dumps(masked_dump(settings), indent=2, default=str))


config_app.command("apply")(config_commands.config_apply)
config_app.command("history")(config_commands.config_history)
config_app.command("rollback")(config_commands.config_rollback)


def serve_command(
    config: ConfigOpt = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Also serve the demo model as 'demo' (built on first use), enable the "
            "openvino_cpu plugin for this run when installed, and migrate the database.",
        ),
    ] = False,
    bind: Annotated[
        list[str] | None, typer.Option("--bind", "-b", help="host:port (repeatable).")
    ] = None,
) -> None:
    """Start the HTTP server (HTTP/1.1, h2c, and TLS h2 when configured)."""
    from servehall.server.serve import serve

    serve(config=config, demo=demo, bind=bind)


def demo_model_command(
    out: Annotated[Path | None, typer.Option("--out", help="Output directory.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if present.")] = False,
    size: Annotated[
        str,
        typer.Option(
            "--size",
            help="demo (~1.3 M parameters, seconds) or small (~25 M, about a minute; "
            "the benchmark model). Default directory: demo-model[-small] in the cache.",
        ),
    ] = "demo",
) -> None:
    """Build the local demo model (a tiny Llama-style model trained here in seconds).

    It is trained on a small built-in corpus, with its own tokenizer. Its text is
    fluent-looking nonsense; it exists to try the platform, not to answer questions.
    """
    from servehall.demo import DEFAULT_DEMO_DIR, build_demo_model, default_demo_dir
    from servehall.demo.model import SIZES

    if size not in SIZES:
        typer.echo(f"error: unknown --size {size!r}; known: {', '.join(SIZES)}", err=True)
        raise typer.Exit(2)
    default = DEFAULT_DEMO_DIR if size == "demo" else default_demo_dir(size)
    path = build_demo_model(out or default, force=force, size=size)
    typer.echo(str(path))


@hookimpl
def servehall_register_commands(cli: typer.Typer) -> None:
    cli.command("serve")(serve_command)
    cli.command("plugins")(plugins_command)
    cli.add_typer(config_app, name="config")
    cli.command("demo-model")(demo_model_command)
    cli.add_typer(_bench_app(), name="bench")
    cli.add_typer(_batch_app(), name="batch")
    cli.add_typer(_models_app(), name="models")


def _models_app() -> typer.Typer:
    from servehall.cli.models import models_app

    return models_app


def _batch_app() -> typer.Typer:
    from servehall.cli.batch import batch_app

    return batch_app


def _bench_app() -> typer.Typer:
    from servehall.bench.cli import bench_app

    return bench_app
