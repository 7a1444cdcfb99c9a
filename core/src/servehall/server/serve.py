"""``servehall serve``: build the host, then run Hypercorn until SIGINT/SIGTERM.

Startup, in order: load the deployment (config + enabled plugins + plugin sections),
check that every ``bind`` address can be bound and every model path is a model
directory (:mod:`servehall.server.listeners`, :mod:`servehall.engines.model_dir`: one-line
errors in a second, before any model is loaded), add the demo model for ``--demo``,
build the host (:func:`servehall.host.versions.build_host`: open the record bus, build
every model — backend via ``BackendRegistry.select``, ``auto`` included, engine start,
tokenizer, scheduler per ``[scheduler] policy`` —, collect input filters), run
``servehall_startup`` hooks, probe every model once (readiness), bind the listening
sockets for real (a port taken since the check fails here with the same one line) and
hand them to Hypercorn, then log ``servehall serving … on …`` and serve.

One Hypercorn listener per ``bind`` entry serves HTTP/1.1, cleartext HTTP/2 (prior
knowledge and ``Upgrade: h2c``) and, with ``certfile``/``keyfile``, TLS with ALPN ``h2``
and ``http/1.1``, limits from ``[server]`` (:mod:`servehall.server.hypercorn.config`),
connection handling corrected by :func:`servehall.server.hypercorn.install_connection_fixes`;
descriptors running out while accepting are logged once per interval with a count
(:class:`servehall.server.accept_errors.AcceptErrorMonitor`). With ``[server]
api_processes = N > 1`` the sockets go to N HTTP frontend processes instead, and the app
serves them over Unix sockets (:mod:`servehall.server.frontends`).

Shutdown: stop accepting, let in-flight requests finish within the graceful timeout,
run ``servehall_shutdown`` hooks, shut engines down, close the record bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servehall.config.models import ModelConfig
from servehall.config.settings import Settings
from servehall.engines.model_dir import check_model_dir
from servehall.errors import ConfigError, EngineError
from servehall.host.versions import build_host, shutdown_host
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.server.listeners import bind_sockets, check_binds, hypercorn_fd_binds
from servehall.server.logs import configure_logging

log = logging.getLogger("servehall.server")


DEMO_BACKEND_PLUGINS: tuple[str, ...] = ("openvino_cpu",)
"""Backend plugins ``--demo`` enables when they are installed, so ``backend = "auto"``
serves the demo model through OpenVINO on the CPU (else the core's torch ``cpu``)."""


def demo_enables(settings: Settings) -> list[str]:
    """The plugins ``serve --demo`` would enable on top of ``[plugins] enabled``
    (those of :data:`DEMO_BACKEND_PLUGINS` that are installed and not enabled yet)."""
    from servehall.plugin.manager import installed_entry_points

    installed = installed_entry_points()
    return [p for p in DEMO_BACKEND_PLUGINS if p in installed and p not in settings.plugins.enabled]


def _demo_plugins(settings: Settings, plugins: PluginHost) -> PluginHost:
    from servehall.config.settings import validate_plugin_sections

    extra = demo_enables(settings)
    if not extra:
        return plugins
    settings.plugins.enabled = [*settings.plugins.enabled, *extra]
    plugins = PluginHost(settings.plugins.enabled)
    validate_plugin_sections(settings, plugins.settings_models())
    return plugins


def _add_demo_model(settings: Settings) -> None:
    from servehall.demo import DEFAULT_DEMO_DIR, DEMO_MODEL_SETTINGS, build_demo_model

    path = Path(build_demo_model(DEFAULT_DEMO_DIR))
    demo = ModelConfig.model_validate(
        {"name": "demo", "path": path, "backend": "auto", **DEMO_MODEL_SETTINGS}
    )
    settings.models = [demo, *(m for m in settings.models if m.name != "demo")]


def hypercorn_config(settings: Settings) -> Any:
    """The Hypercorn config for ``[server]`` (see
    :func:`servehall.server.hypercorn.config.server_config`)."""
    from servehall.server.hypercorn.config import server_config

    return server_config(settings.server)


async def run(settings: Settings, plugins: PluginHost, config_path: Path | None = None) -> None:
    """Build the host and serve until SIGINT/SIGTERM (SIGHUP re-reads ``config_path``
    and applies it live, :mod:`servehall.rollout.live`)."""
    from hypercorn.asyncio import serve as hypercorn_serve

    from servehall.api.app import create_app
    from servehall.api.disconnect import install_closed_write_filter
    from servehall.api.tracing import Tracing
    from servehall.batches.runner import BatchRunner
    from servehall.metrics import Metrics
    from servehall.rollout.idle import IdleUnloader
    from servehall.server.accept_errors import AcceptErrorMonitor
    from servehall.server.agent import AgentServer
    from servehall.server.frontends import resolve_api_processes, serve_frontends
    from servehall.server.hypercorn import install_connection_fixes
    from servehall.serving.probe import Readiness

    cfg = hypercorn_config(settings)
    install_connection_fixes()
    install_closed_write_filter()
    host = await build_host(settings, plugins)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    readiness = Readiness(host)
    metrics = Metrics(lambda: host)
    accept_errors = AcceptErrorMonitor(metrics.registry)
    accept_errors.install(loop)
    tracing: Tracing | None = None
    agent: AgentServer | None = None
    live = _live_config(host, readiness, config_path)
    idle = IdleUnloader(host)
    files: Any = None  # the app's FileService, closed on the way out
    batches: Any = None  # the BatchRunner, stopped before the files close
    responses: Any = None  # the app's ResponseStore, closed on the way out
    readiness.config_report = live.report
    metrics.config_revision.set_function(lambda: float(live.revision))
    try:
        await plugins.startup(host)
        tracing = Tracing.from_settings(settings.tracing)
        app = create_app(host, metrics=metrics, readiness=readiness, tracing=tracing, live=live)
        files = app.state.api.files
        responses = app.state.api.responses
        for served in host.models.values():
            if not await readiness.probe(served):
                raise EngineError(
                    f"model {served.key}: the startup probe inference failed: "
                    f"{readiness.last_error.get(served.key)}"
                )
        readiness.start()
        if settings.server.agent_bind:
            agent = AgentServer(host, readiness, stop.is_set, settings.server.agent_bind)
            await agent.start()
        idle.start()
        batches = BatchRunner(app, host, files, metrics)
        batches.start()
        live.install_sighup()
        if settings.server.config_revisions:
            await _open_revisions(live, settings)
        binds = list(cfg.bind)
        frontends = resolve_api_processes(settings.server.api_processes)
        log.info(
            "servehall serving %s on %s%s",
            ", ".join(host.models),
            ", ".join(binds),
            f" with {frontends} API processes" if frontends > 1 else "",
        )
        freeze_startup_heap()
        if frontends > 1:
            restarts = metrics.api_process_restarts
            await serve_frontends(
                app,
                settings.server,
                binds,
                frontends,
                stop,
                on_restart=lambda _: restarts.inc(),
                on_accept_error=accept_errors.count,
            )
        else:
            cfg.bind = hypercorn_fd_binds(bind_sockets(binds))
            await hypercorn_serve(app, cfg, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        if agent is not None:
            await agent.close()  # answered "drain" while the listeners drained
        accept_errors.uninstall()
        if batches is not None:
            await batches.stop()  # lines in flight go back to pending
        await idle.stop()
        await live.close()
        await readiness.stop()
        if files is not None:
            await files.close()
        if responses is not None:
            await responses.close()
        try:
            await plugins.shutdown(host)
        except Exception:
            log.exception("a shutdown hook failed")
        await shutdown_host(host)
        if tracing is not None:
            tracing.shutdown()  # flushes the spans still batched
        log.info("servehall stopped")


def freeze_startup_heap() -> None:
    """Collect the startup garbage, then freeze what is left (imported modules,
    tokenizers, the app, the host) in the collector's permanent generation
    (:func:`gc.freeze`), so full collections stop re-walking the imported library stack:
    about a quarter of the API process's CPU per one-token request on the ``null``
    engine (``bench/bench_api_cpu.py``, docs/performance.md). Only what exists before
    serving is frozen, and it lives as long as the process anyway.
    """
    import gc

    gc.collect()
    gc.freeze()


def _live_config(host: Host, readiness: Any, config_path: Path | None) -> Any:
    """The :class:`~servehall.rollout.live.LiveConfig` of a host started from
    ``config_path`` (None: defaults only; SIGHUP then has nothing to re-read)."""
    from servehall.config.settings import config_format
    from servehall.rollout.live import LiveConfig

    text = config_path.read_text(encoding="utf-8") if config_path is not None else ""
    fmt = config_format(config_path) if config_path is not None else "toml"
    return LiveConfig(host, readiness, text, fmt, config_path)


async def _open_revisions(live: Any, settings: Settings) -> None:
    """Keep config revisions in the records database (``[server] config_revisions``).

    Raises:
        ConfigError: the database is not migrated (names ``servehall db upgrade``).
    """
    from servehall.db.engine import create_db_engine
    from servehall.db.migrate import ensure_schema

    db = create_db_engine(settings)
    try:
        plugins = live.host.plugins
        await ensure_schema(
            db,
            auto_migrate=settings.database.auto_migrate,
            branches=plugins.migrations(),
            known=plugins.other_migrations(),
        )
        url = settings.server.config_broadcast_url
        await live.open_revisions(db, url.get_secret_value() if url is not None else None)
    except BaseException:
        await db.dispose()
        raise


def serve(
    config: Path | str | None = None, demo: bool = False, bind: Sequence[str] | None = None
) -> None:
    """Entry point of ``servehall serve``; blocks until stopped.

    Args:
        config: config file (else ``$SERVEHALL_CONFIG``, else defaults).
        demo: serve the demo model (built on first use) as model ``demo`` on backend
            ``auto``, enabling the installed backend plugins of
            :data:`DEMO_BACKEND_PLUGINS`, and migrate the records database automatically
            (``[database] auto_migrate``).
        bind: ``host:port`` entries replacing ``server.bind``.

    Raises:
        ConfigError: e.g. ``cannot bind 127.0.0.1:8000: address already in use`` (checked
            before any model is loaded), a model path that is not a model directory.
        PluginError, EngineError: startup failed (the CLI prints the message).
    """
    from servehall.server.bootstrap import load_deployment

    settings, plugins = load_deployment(config)
    extra = demo_enables(settings) if demo else []
    if demo:
        plugins = _demo_plugins(settings, plugins)
    plugins.check_enabled()
    configure_logging(settings.server.log_level)
    if extra:
        log.info("--demo: plugin(s) %s enabled for this run", ", ".join(extra))
    if bind:
        for b in bind:
            host, sep, port = b.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"--bind {b!r} is not host:port")
        settings.server.bind = list(bind)
    check_binds(settings.server.bind)
    for mc in settings.models:
        if not (demo and mc.name == "demo") and mc.source is None:
            check_model_dir(mc.name, mc.path)  # a URL's files are pulled at start
    if demo:
        _add_demo_model(settings)
        # the "try it" path must need no file and no extra step: migrate the local DB
        settings.database.auto_migrate = True
    import os

    chosen = config if config is not None else os.environ.get("SERVEHALL_CONFIG")
    path = Path(chosen).expanduser() if chosen else None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings, plugins, path))
