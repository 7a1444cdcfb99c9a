"""``servehall batch``: submit a batch input file to a running server, follow it, fetch
its results — over the server's OpenAI API (``/v1/files``, ``/v1/batches``), with an
API key like any client.

* ``servehall batch submit FILE`` uploads FILE (purpose ``batch``) and creates a batch
  for the endpoint its first line names; prints the batch id (``--json``: the batch
  object).
* ``servehall batch status ID`` prints the status and request counts (``--json``: the
  batch object); ``--wait`` polls until the batch ends.
* ``servehall batch results ID`` writes the output file's lines to stdout (``--errors``:
  the error file's), or both files into ``--out DIR``.

The server is ``--base-url`` (or ``$SERVEHALL_URL``), else the first ``[server] bind``
of the config given with ``--config`` (or ``$SERVEHALL_CONFIG``; ``http://``), else
``http://127.0.0.1:8000``. An answer with status ≥ 400 prints the server's error message
and exits 1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

batch_app = typer.Typer(
    help="Submit batch files to a running server, follow them, fetch their results.",
    no_args_is_help=True,
)

DONE = ("completed", "failed", "expired", "cancelled")
"""Statuses a batch ends in."""

BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        envvar="SERVEHALL_URL",
        help="Server root (or $SERVEHALL_URL; default: the config's first bind).",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML/YAML); default $SERVEHALL_CONFIG."),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key (or $OPENAI_API_KEY)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the batch object as JSON.")]


def _server(base_url: str | None, config: Path | None) -> str:
    """The server root (see the module docstring)."""
    if base_url:
        return base_url.rstrip("/")
    from servehall.config.settings import load_settings

    binds = load_settings(config).server.bind
    host, _, port = (binds[0] if binds else "127.0.0.1:8000").rpartition(":")
    if host in ("0.0.0.0", "", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def _client(base_url: str | None, api_key: str | None, config: Path | None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=_server(base_url, config), headers=headers, timeout=120.0)


def _answer(r: Any) -> Any:
    """The JSON of a 2xx answer; otherwise the error's message on stderr and exit 1."""
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:500]
        typer.echo(f"error: {r.status_code}: {message}", err=True)
        raise typer.Exit(1)
    return r.json()


def _endpoint(file: Path) -> str:
    """The ``url`` of FILE's first request line."""
    with file.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    url = None
                if not isinstance(url, str):
                    typer.echo(f"error: the first line of {file} names no 'url'", err=True)
                    raise typer.Exit(1)
                return url
    typer.echo(f"error: {file} holds no request", err=True)
    raise typer.Exit(1)


@batch_app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="Batch input file (JSON lines).", exists=True)],
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="The batch's endpoint (default: the first line's url)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload FILE and create a batch of it (completion window 24h); print its id."""
    with _client(base_url, api_key, config) as c, file.open("rb") as f:
        made = _answer(
            c.post("/v1/files", files={"file": (file.name, f)}, data={"purpose": "batch"})
        )
        batch = _answer(
            c.post(
                "/v1/batches",
                json={
                    "input_file_id": made["id"],
                    "endpoint": endpoint or _endpoint(file),
                    "completion_window": "24h",
                },
            )
        )
    typer.echo(json.dumps(batch, indent=2) if as_json else batch["id"])


def _summary(batch: dict[str, Any]) -> str:
    counts = batch.get("request_counts") or {}
    return (
        f"{batch['id']} {batch['status']}: {counts.get('completed', 0)} completed, "
        f"{counts.get('failed', 0)} failed of {counts.get('total', 0)}"
    )


@batch_app.command("status")
def status(
    batch_id: Annotated[str, typer.Argument(help="The batch id (batch_…).")],
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Poll until the batch ends.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Print a batch's status and request counts."""
    with _client(base_url, api_key, config) as c:
        while True:
            batch = _answer(c.get(f"/v1/batches/{batch_id}"))
            if not wait or batch["status"] in DONE:
                break
            time.sleep(1.0)
    typer.echo(json.dumps(batch, indent=2) if as_json else _summary(batch))


@batch_app.command("results")
def results(
    batch_id: Annotated[str, typer.Argument(help="The batch id (batch_…).")],
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    errors: Annotated[
        bool, typer.Option("--errors", help="Print the error file instead of the output file.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write <id>_output.jsonl and <id>_error.jsonl into DIR."),
    ] = None,
) -> None:
    """Print a batch's output (or error) file, or write both into a directory."""
    with _client(base_url, api_key, config) as c:
        batch = _answer(c.get(f"/v1/batches/{batch_id}"))
        if out is None:
            file_id = batch["error_file_id" if errors else "output_file_id"]
            if file_id is not None:
                r = c.get(f"/v1/files/{file_id}/content")
                _answer_bytes(r)
                sys.stdout.write(r.text)
            return
        out.mkdir(parents=True, exist_ok=True)
        for kind in ("output", "error"):
            file_id = batch[f"{kind}_file_id"]
            if file_id is not None:
                r = c.get(f"/v1/files/{file_id}/content")
                _answer_bytes(r)
                path = out / f"{batch_id}_{kind}.jsonl"
                path.write_bytes(r.content)
                typer.echo(str(path))


def _answer_bytes(r: Any) -> None:
    if r.status_code >= 400:
        _answer(r)
