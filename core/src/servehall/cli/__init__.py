"""The ``servehall`` command line (Typer). Core commands and plugin commands both arrive
through ``servehall_register_commands``; the core's live in ``servehall.defaults.commands``."""

from __future__ import annotations

import os
import sys

import click
import typer
from typer.core import TyperGroup

from servehall.errors import ServehallError

PLUGIN_COMMANDS_HINT = (
    "Plugins add commands (such as 'keys' of the auth plugin) when they are listed in "
    "[plugins] enabled of the config given with --config FILE (or SERVEHALL_CONFIG)."
)


class _Commands(TyperGroup):
    """The top-level group: an unknown command's error says where plugin commands come
    from (a user who installed a plugin but gave no ``--config`` sees why it is missing)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if args and args[0] not in self.commands:
                raise click.UsageError(f"{exc.message} {PLUGIN_COMMANDS_HINT}", ctx) from None
            raise


def _preparse_config(argv: list[str]) -> str | None:
    """The config path named on the command line (``--config F``, ``--config=F``, ``-c F``,
    ``-cF``: every command spells its option so), else ``SERVEHALL_CONFIG``."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg.startswith("-c") and len(arg) > 2 and not arg.startswith("--"):
            return arg[2:]
    return os.environ.get("SERVEHALL_CONFIG")


def build_cli(argv: list[str] | None = None) -> typer.Typer:
    """The Typer app with core commands plus the commands of the enabled plugins.

    Plugins listed in ``[plugins] enabled`` of the config named by ``--config`` (or
    ``SERVEHALL_CONFIG``) may add commands; a config that cannot be read here is
    reported later by the command itself.
    """
    from servehall.config.settings import load_settings
    from servehall.plugin.manager import PluginHost

    cli = typer.Typer(
        name="servehall",
        cls=_Commands,
        help="servehall: serve LLMs over an OpenAI-compatible HTTP/2 API through plugins.",
        epilog=PLUGIN_COMMANDS_HINT.replace("[", "\\["),  # rich markup would eat [plugins]
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    enabled: list[str] = []
    try:
        path = _preparse_config(sys.argv[1:] if argv is None else argv)
        enabled = load_settings(path).plugins.enabled
    except ServehallError:
        enabled = []
    try:
        host = PluginHost(enabled)
    except ServehallError:
        host = PluginHost([])
    host.commands(cli)
    return cli


def main() -> None:
    """Console-script entry point."""
    try:
        build_cli()()
    except ServehallError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
