"""``servehall models``: the node's model cache, for operators (docs/models.md, "Model
sources").

* ``servehall models push DIR URL`` uploads a local model directory to ``s3://…`` with
  its ``servehall-manifest.json`` (written last).
* ``servehall models pull SOURCE`` brings a model into the cache (what a version's start
  does) and prints its cached directory. SOURCE is a URL or a ``[[models]]`` name of the
  config.
* ``servehall models verify SOURCE`` checks every file of a cached model against its
  manifest again (SOURCE: a URL, a model name or a directory holding a manifest); exit 1
  naming each file that differs.
* ``servehall models ls`` lists the cached models: key, source, size, last use, in use.
* ``servehall models eval`` runs a version's accuracy gate offline
  (:mod:`servehall.cli.models_eval`).

``[model_store]`` of the config (``--config`` or ``$SERVEHALL_CONFIG``) gives the cache
directory and the S3 endpoint and credentials.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from servehall.cli.models_eval import eval_command
from servehall.config.models import ModelStoreSettings

models_app = typer.Typer(
    help="Operate on models: push to a store, pull into the node's cache, verify, list; "
    "the accuracy gate (eval).",
    no_args_is_help=True,
)
models_app.command("eval")(eval_command)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]


def _settings(config: Path | None) -> tuple[ModelStoreSettings, dict[str, str]]:
    """``[model_store]`` and ``{model name: source URL}`` of the config's URL models."""
    from servehall.config.settings import load_settings

    settings = load_settings(config)
    names = {m.name: m.source for m in settings.models if m.source is not None}
    return settings.model_store, names


def _url(source: str, names: dict[str, str]) -> str:
    """The URL ``source`` names (itself, or a ``[[models]]`` name's)."""
    if "://" in source:
        from servehall.config.models import check_source_url

        try:
            return check_source_url(source)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    if source in names:
        return names[source]
    known = ", ".join(sorted(names)) or "none"
    raise typer.BadParameter(
        f"{source!r} is neither a URL nor a [[models]] name with a URL path (those: {known})"
    )


@models_app.command("push")
def push_command(
    directory: Annotated[Path, typer.Argument(help="The local model directory.")],
    url: Annotated[str, typer.Argument(help="s3://bucket/prefix to upload to.")],
    config: ConfigOpt = None,
) -> None:
    """Upload DIRECTORY's files to URL, then its servehall-manifest.json (SHA-256 of
    every file), so a pull never sees a manifest whose files are not all there."""
    from servehall.config.models import check_source_url
    from servehall.sources.push import push

    store, _ = _settings(config)
    try:
        check_source_url(url)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    manifest = push(directory.expanduser(), url, store)
    typer.echo(f"{url}: {len(manifest.files)} files, {manifest.total_bytes} bytes")


@models_app.command("pull")
def pull_command(
    source: Annotated[str, typer.Argument(help="A URL or a [[models]] name.")],
    config: ConfigOpt = None,
) -> None:
    """Bring the model into the node's cache (resuming an interrupted pull; every file
    checked against the manifest) and print its cached directory."""
    from servehall.server.logs import configure_logging
    from servehall.sources.pull import pull

    configure_logging("info")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    store, names = _settings(config)
    pulled = pull(_url(source, names), store)
    typer.echo(str(pulled.path))


@models_app.command("verify")
def verify_command(
    source: Annotated[
        str, typer.Argument(help="A URL, a [[models]] name, or a directory with a manifest.")
    ],
    config: ConfigOpt = None,
) -> None:
    """Check every file of the cached model against its manifest again; exit 1 naming
    each file that is missing or differs."""
    from servehall.sources.cache import ModelCache
    from servehall.sources.manifest import MANIFEST_NAME, Manifest, verify_dir

    directory = Path(source).expanduser()
    if "://" in source or not directory.is_dir():
        store, names = _settings(config)
        url = _url(source, names)
        key = ModelCache(store.cache_dir).known(url)
        if key is None:
            typer.echo(f"{url}: not in the cache {store.cache_dir}", err=True)
            raise typer.Exit(1)
        directory = ModelCache(store.cache_dir).entry_dir(key)
    mpath = directory / MANIFEST_NAME
    try:
        manifest = Manifest.parse(mpath.read_bytes(), str(mpath))
    except OSError as exc:
        typer.echo(f"{mpath}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    problems = verify_dir(directory, manifest)
    for p in problems:
        typer.echo(f"{directory}: {p}", err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{directory}: {len(manifest.files)} files OK")


@models_app.command("ls")
def ls_command(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the models in the node's cache, least recently used first."""
    from rich.console import Console

    from servehall.cli.tables import print_table
    from servehall.sources.cache import ModelCache

    store, _ = _settings(config)
    entries = ModelCache(store.cache_dir, store.cache_max_bytes).entries()
    if as_json:
        rows = [
            {
                "key": e.key,
                "source": e.source,
                "bytes": e.bytes,
                "last_used": e.last_used,
                "in_use": e.in_use,
                "path": str(e.path),
            }
            for e in entries
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    limit = f"{store.cache_max_bytes / 1e6:.1f} MB" if store.cache_max_bytes else "no limit"
    total = sum(e.bytes for e in entries)
    print_table(
        Console(),
        f"{store.cache_dir} ({total / 1e6:.1f} MB; {limit})",
        ("key", "source", "size", "last used", "in use"),
        [
            (
                e.key,
                e.source,
                f"{e.bytes / 1e6:.1f} MB",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used)),
                "yes" if e.in_use else "no",
            )
            for e in entries
        ],
        no_wrap=("key", "source"),
    )
