"""A real servehall API on a real Hypercorn (h2c and HTTP/1.1, servehall's connection
fixes installed as ``servehall serve`` does) in a thread of the test process, serving
model ``m`` on the ``null`` engine with a locally built tokenizer and a migrated SQLite
database: a server for the soak's own tests that starts in a fraction of a second.

``serving(work, **null_options)`` is a context manager that yields the base URL
(``http://127.0.0.1:PORT``); the server stops on exit. Records go to an in-memory
collector (the soak's database checks are skipped against it: no ``--db-url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.testing.sockets import free_port


def model_dir(work: Path) -> Path:
    """The tokenizer and ``config.json`` of model ``m`` under ``work`` (built once)."""
    out = work / "model"
    if not (out / "config.json").is_file():
        build_tokenizer(out)
        facts = {"vocab_size": 400, "max_position_embeddings": 512, "eos_token_id": 1}
        (out / "config.json").write_text(json.dumps(facts))
    return out


async def _serve(
    work: Path, port: int, options: dict[str, Any], ready: threading.Event, stop: asyncio.Event
) -> None:
    from hypercorn.asyncio import serve

    from servehall.api.app import create_app
    from servehall.api.disconnect import install_closed_write_filter
    from servehall.config.models import ModelConfig
    from servehall.db import create_db_engine
    from servehall.db.migrate import upgrade_database
    from servehall.engines.null import NullEngine
    from servehall.server.hypercorn import install_connection_fixes
    from servehall.server.serve import hypercorn_config

    path = model_dir(work)
    db = work / f"servehall-{port}.db"
    url = f"sqlite+aiosqlite:///{db}"
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()
    null = NullEngine(ModelConfig(name="m", path=path, backend="null", options=options))
    await null.start()
    host = make_host(path, ScriptedEngine([5]), settings={"database": {"url": url}})
    served = host.models["m"]
    served.engine, served.backend, served.max_model_len = null, "null", 512  # type: ignore[assignment]
    install_connection_fixes()
    install_closed_write_filter()
    cfg = hypercorn_config(host.settings)
    cfg.bind = [f"127.0.0.1:{port}"]
    app = create_app(host)
    try:
        task = asyncio.create_task(serve(app, cfg, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        while not task.done():
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.02)
        ready.set()
        await task
    finally:
        ready.set()
        for service in (app.state.api.files, app.state.api.responses):
            if service is not None:
                await service.close()
        await null.shutdown()


@contextlib.contextmanager
def serving(work: Path, **null_options: Any) -> Iterator[str]:
    """Serve model ``m`` (``null`` engine with ``null_options``) while in the block."""
    port = free_port()
    ready = threading.Event()
    errors: list[BaseException] = []
    held: dict[str, Any] = {}

    async def main() -> None:
        held["loop"], held["stop"] = asyncio.get_running_loop(), asyncio.Event()
        await _serve(work, port, null_options, ready, held["stop"])

    def run() -> None:
        try:
            asyncio.run(main())  # cancels what the server left running, then closes
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="soak-test-server", daemon=True)
    thread.start()
    assert ready.wait(60), "the test server did not start"
    if errors:
        raise errors[0]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(30)
    if errors:
        raise errors[0]
