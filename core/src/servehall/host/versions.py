"""The model-version lifecycle: build the host's versions, start and stop one.

:func:`build_host` starts everything a request needs at ``servehall serve`` startup:
the plugins' tables checked (or migrated), the record bus opened, every ``[[models]]``
entry started (:func:`start_version`: backend via ``BackendRegistry.select`` — ``auto``
included —, tokenizer, engine, scheduler per ``[scheduler] policy``) and the input
filters collected. :func:`start_version` and :func:`stop_engine` are also what live
config changes (:mod:`servehall.rollout.live`) and idle unloading
(:mod:`servehall.rollout.idle`) use, so this module sits below both ``rollout/`` and
``server/``; :func:`shutdown_host` stops every engine and closes the record bus.

A version whose ``path`` is a URL (``source``) is first pulled into the node's model
cache (:func:`servehall.sources.pull.pull`, retried while the store does not answer);
the engine gets the cached directory, and the version holds a lease on it until its
engine stops. A file that does not match the manifest refuses the version and is
audited (``model.integrity_refused``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from servehall.config.models import ModelConfig
from servehall.config.settings import Settings
from servehall.engines.backends import BackendSpec
from servehall.engines.contract import Engine, check_embedding_engine
from servehall.engines.model_dir import check_model_dir
from servehall.errors import ConfigError
from servehall.plugin.host import Host, ServedModel, model_key
from servehall.plugin.manager import PluginHost
from servehall.tools.parsers import guess_parser_name
from servehall.worker.client import ProcessEngine
from servehall.worker.gate import EngineGate

log = logging.getLogger("servehall.server")


async def build_host(settings: Settings, plugins: PluginHost) -> Host:
    """Start everything a request needs (see the module docstring); on any failure
    the versions already started are stopped and the record bus closed before the error
    propagates.

    Raises:
        ConfigError: no models, an unknown policy or backend, a path that is not a model
            directory (:func:`servehall.engines.model_dir.check_model_dir`), an unusable tokenizer.
        EngineError: an engine failed to start.
    """
    from servehall.records.bus import open_record_bus

    if not settings.models:
        raise ConfigError("no [[models]] configured (use --demo to serve the demo model)")
    host = Host(settings=settings, plugins=plugins)
    await ensure_plugin_schema(settings, plugins)
    host.records = await open_record_bus(settings, plugins)
    try:
        # gated versions last: one compared against = "serving" finds the others started
        for mc in sorted(settings.models, key=lambda m: m.gate is not None):
            key = model_key(mc.name, mc.version)
            if key in host.models:
                raise ConfigError(f"model {key!r} configured twice")
            host.models[key] = await start_version(host, mc)
        host.input_filters = plugins.input_filters(host)
    except BaseException:
        await shutdown_host(host)
        raise
    return host


async def start_version(host: Host, mc: ModelConfig, state: str = "serving") -> ServedModel:
    """Build and start one ``[[models]]`` entry (a version): backend via
    ``BackendRegistry.select``, tokenizer, engine (started: the worker has loaded the
    model), scheduler per ``[scheduler] policy``; then, with a ``gate``, its accuracy gate
    (:func:`servehall.host.gate.run_gate`: the golden set answered greedily before the
    version exists for the router). Used at startup, by live config changes
    (:mod:`servehall.rollout.live`), which register it with ``state="loading"``, and by
    idle reloads (:mod:`servehall.rollout.idle`).

    Raises:
        ConfigError: a path that is not a model directory, an unusable tokenizer, an
            unknown backend, a URL whose model cannot be pulled (:func:`pull_source`);
            the gate could not run (golden file, timeout); ``tool_call_grammar =
            "always"`` on an engine without structural tags (the engine is stopped).
        GateFailed: the gate's score is below its ``min`` (a ConfigError with the
            figures); the engine is stopped.
        EngineError: the engine failed to start.
    """
    run_mc, release = await pull_source(host, mc)
    try:
        served = await _start(host, mc, run_mc, state)
    except BaseException:
        if release is not None:
            release()
        raise
    if release is not None:
        served.on_stop.append(release)
    return served


async def pull_source(host: Host, mc: ModelConfig) -> tuple[ModelConfig, Callable[[], None] | None]:
    """``mc`` itself for a local path; for a URL (``mc.source``) the entry with ``path``
    set to the pulled model's cached directory and the release of its cache lease.

    The pull runs on a thread and is tried ``[model_store] pull_attempts`` times while
    the store does not answer (1, 2, 4… s apart).

    Raises:
        ConfigError: one line naming ``models.NAME.path``: a file that does not match
            the manifest (audited as ``model.integrity_refused``), a store that did
            not answer, refused credentials, a malformed manifest, a full disk.
    """
    if mc.source is None:
        return mc, None
    from servehall.sources.errors import IntegrityError, SourceError, StoreUnavailableError
    from servehall.sources.pull import PullProgress, pull

    key = model_key(mc.name, mc.version)
    store_settings = host.settings.model_store
    attempts = store_settings.pull_attempts

    def progress(p: PullProgress) -> None:  # on the pull's thread: one dict store
        host.pulls[key] = f"{p.describe()} from {mc.source}"

    host.pulls[key] = f"pulling {mc.source}"
    try:
        for attempt in range(1, attempts + 1):
            try:
                pulled = await asyncio.to_thread(
                    pull, mc.source, store_settings, label=key, lease=True, on_progress=progress
                )
                break
            except StoreUnavailableError as exc:
                if attempt == attempts:
                    raise ConfigError(
                        f"models.{mc.name}.path: {exc.message} (tried {attempts} times)"
                    ) from None
                wait = 2.0 ** (attempt - 1)
                log.warning("model %s: %s; retrying in %.0f s", key, exc.message, wait)
                host.pulls[key] = f"{exc.message}; retrying in {wait:.0f} s"
                await asyncio.sleep(wait)
            except IntegrityError as exc:
                details = {"source": mc.source, "file": exc.file}
                _audit(host, "model.integrity_refused", key, details)
                raise ConfigError(f"models.{mc.name}.path: {exc.message}") from None
            except SourceError as exc:
                raise ConfigError(f"models.{mc.name}.path: {exc.message}") from None
    finally:
        host.pulls.pop(key, None)
    lease = pulled.lease
    assert lease is not None
    log.info("model %s: %s is %s", key, mc.source, pulled.path)
    return mc.model_copy(update={"path": pulled.path}), lease.release


def _audit(host: Host, action: str, target: str, details: dict[str, Any]) -> None:
    from servehall.records.types import AuditEvent

    if host.records is not None:
        host.records.audit(AuditEvent(action=action, target=target, details=details))


async def _start(host: Host, mc: ModelConfig, run_mc: ModelConfig, state: str) -> ServedModel:
    """:func:`start_version`'s work once the files are local: ``run_mc`` (``mc`` with the
    local ``path``) is what the engine gets; ``mc`` what the version keeps."""
    from servehall.text.tokenizer import load_tokenizer

    settings = host.settings
    key = model_key(mc.name, mc.version)
    check_model_dir(mc.name, run_mc.path)
    spec = host.plugins.backends().select(mc.backend)
    try:
        tokenizer = load_tokenizer(run_mc.path)
    except Exception as exc:
        raise ConfigError(
            f"models.{mc.name}: cannot load the tokenizer from {run_mc.path}: {exc}"
        ) from None
    parser_name = mc.tool_parser or guess_parser_name(getattr(tokenizer.hf, "chat_template", None))
    try:
        tool_parser = host.plugins.tool_parsers().get(parser_name)
    except ConfigError as exc:
        raise ConfigError(f"models.{mc.name}.tool_parser: {exc}") from None
    log.info(
        "model %s: backend %s (%s isolation), loading %s",
        key,
        spec.name,
        mc.isolation,
        run_mc.path,
    )
    engine = make_engine(host, run_mc, spec, tokenizer)
    t0 = time.monotonic()
    await engine.start()
    load_s = time.monotonic() - t0
    try:
        limits = [engine.model_info.max_model_len, mc.max_model_len or math.inf]
        scheduler = (
            host.plugins.schedulers().get(settings.scheduler.policy).factory(settings.scheduler)
        )
        check_tool_call_grammar(mc, spec.name, engine.supported_params)
        if isinstance(engine, ProcessEngine):
            scheduler = EngineGate(scheduler, engine, mc.name, settings.scheduler)
        if mc.gate is not None:
            from servehall.host.gate import run_gate

            await run_gate(host, mc, engine, tokenizer)
    except BaseException:
        await engine.shutdown()
        raise
    return ServedModel(
        name=mc.name,
        backend=spec.name,
        engine=engine,
        scheduler=scheduler,
        tokenizer=tokenizer,
        max_model_len=int(min(limits)),
        tool_parser=tool_parser,
        tool_call_grammar=mc.tool_call_grammar,
        version=mc.version,
        weight=mc.weight,
        state=state,
        rollback_if=mc.rollback_if,
        config=mc,
        loads=1,
        last_load_s=load_s,
    )


def check_tool_call_grammar(mc: ModelConfig, backend: str, supported: frozenset[str]) -> None:
    """Refuse ``tool_call_grammar = "always"`` on an engine that cannot compile the
    structural tag it puts on every ``tool_choice: "auto"`` request (``supported``: the
    started engine's :attr:`~servehall.engines.contract.Engine.supported_params`, which
    list ``"structural_tag"`` where it can; an embedding model never takes tools).

    Raises:
        ConfigError: ``models.NAME.tool_call_grammar: ...`` naming the backend.
    """
    if mc.tool_call_grammar != "always" or mc.task != "generate":
        return
    if "structural_tag" not in supported:
        raise ConfigError(
            f"models.{mc.name}.tool_call_grammar: 'always' needs a backend that constrains "
            f"decoding with structural tags; backend {backend!r} cannot here (use 'strict', "
            "or a backend such as openvino_cpu, cpu/cuda (torch) or vllm)"
        )


def make_engine(
    host: Host,
    mc: ModelConfig,
    spec: BackendSpec,
    tokenizer: Any,
) -> Engine:
    """The unstarted engine of ``mc``: ``spec.factory(mc)`` for ``isolation = "thread"``,
    else a :class:`~servehall.worker.ProcessEngine` whose worker runs the backend
    ``spec.name``, supervised with :meth:`BackendSpec.worker_settings` (the engine's
    defaults under the config's keys; restarts and crash loops become audit events
    ``engine.restart`` / ``engine.crash_loop``); the backend's build step
    (:meth:`BackendSpec.prepare_step`) runs before the worker starts."""
    if mc.isolation == "thread":
        engine = spec.factory(mc)
        check_embedding_engine(mc.name, mc.task, engine)
        return engine
    settings = spec.worker_settings(mc)

    def on_event(action: str, details: dict[str, Any]) -> None:
        from servehall.records.types import AuditEvent

        if host.records is not None:
            host.records.audit(
                AuditEvent(
                    action=f"engine.{action}",
                    target=model_key(mc.name, mc.version),
                    details=details,
                )
            )

    try:
        probe = tokenizer.encode_plain("ready", add_special_tokens=True) or None
    except Exception:
        probe = None
    return ProcessEngine(
        mc,
        spec.name,
        host.settings.plugins.enabled,
        settings=settings,
        log_level=host.settings.server.log_level,
        probe_prompt=probe,
        on_event=on_event,
        prepare=spec.prepare_step(),
    )


async def ensure_plugin_schema(settings: Settings, plugins: PluginHost) -> None:
    """When an enabled plugin owns tables, check (or, with ``[database] auto_migrate``,
    apply) the core's revisions and every enabled plugin's branch before anything starts.

    Raises:
        ConfigError: the database is not migrated (names ``servehall db upgrade``).
        PluginError: an enabled plugin's migration branch is missing (names the plugin).
    """
    branches = plugins.migrations()
    if not branches:
        return
    from servehall.db.engine import create_db_engine
    from servehall.db.migrate import ensure_schema

    engine = create_db_engine(settings)
    try:
        await ensure_schema(
            engine,
            auto_migrate=settings.database.auto_migrate,
            branches=branches,
            known=plugins.other_migrations(),
        )
    finally:
        await engine.dispose()


async def stop_engine(served: ServedModel) -> None:
    """Shut ``served``'s engine down, then run its ``on_stop`` callbacks (the release of
    a pulled model's cache lease); an error is logged, not raised."""
    try:
        await served.engine.shutdown()
    except Exception:
        log.exception("engine of %s failed to shut down", served.key)
    while served.on_stop:
        try:
            served.on_stop.pop()()
        except Exception:
            log.exception("a stop callback of %s failed", served.key)


async def shutdown_host(host: Host) -> None:
    """Stop engines and close the record bus (errors are logged, not raised)."""
    for served in host.models.values():
        await stop_engine(served)
    if host.records is not None:
        try:
            await host.records.close()
        except Exception:
            log.exception("record bus failed to close")
