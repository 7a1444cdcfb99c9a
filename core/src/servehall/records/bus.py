"""The record bus: the request path's only door to the records layer.

Interface used by the request path:

* ``await open_record_bus(settings, plugins) -> RecordBus`` at startup: builds the sinks
  of ``[[sinks]]`` (kinds from ``servehall_register_sinks``; the core offers ``sql`` and
  ``jsonl``), starts them (the ``sql`` sink refuses an un-migrated database with a
  :class:`~servehall.errors.ConfigError` naming ``servehall db upgrade``, or migrates
  when ``[database] auto_migrate``), then records the ``config.loaded`` and
  ``plugins.loaded`` audit events;
* ``bus.emit(RequestRecord)`` and ``bus.audit(AuditEvent)``: synchronous, never block,
  never raise; call them on the event loop thread;
* ``bus.check_admission()``: raises :class:`~servehall.errors.ServiceUnavailableError`
  (503, ``Retry-After``, code ``records_unavailable``) while a ``required`` sink cannot
  write and its buffer is exhausted — or, with ``fail_closed = "at_once"``, from its
  first failed write (fail closed); the refusal's own record is kept and written later;
* ``bus.unready_sinks()``: ``{sink name: reason}`` for every ``required`` sink that
  cannot record right now (``/health/ready`` answers 503 naming them);
* ``await bus.close()``: flush and close at shutdown (unwritten records are saved to
  the spill file and replayed at the next start).

Each sink gets its own :class:`~servehall.records.runner.SinkRunner` (bounded queue,
batches, retry with backoff, spill file, replay). Runner settings come from the sink's
``options`` (``buffer``, ``batch_size``, ``linger_s``, ``spill``, ``spill_path``,
``spill_max_bytes``, ``retry_initial_s``, ``retry_max_s``, ``retry_after_s``,
``close_timeout_s``, ``commit_wait_s``, ``fail_closed``, ``max_refused``); the other
options go to the sink's factory. With ``commit_wait_s`` on a sink,
:meth:`RecordBus.wait_written` holds a response's last bytes until that sink has written
the request's record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from servehall.errors import ConfigError, ServehallError, ServiceUnavailableError
from servehall.records.runner import FAIL_CLOSED_CODE, RUNNER_OPTIONS, SinkRunner
from servehall.records.types import AuditEvent, RequestRecord

if TYPE_CHECKING:
    from servehall.config.settings import Settings
    from servehall.plugin.manager import PluginHost

log = logging.getLogger("servehall.records")


class RecordBus:
    """Fans records out to sink runners (see module docstring).

    Args:
        runners: one started :class:`SinkRunner` per configured sink (may be empty: the
            bus then keeps nothing, e.g. ``sinks = []`` in tests).
        store_prompts: ``[database] store_prompts``: whether prompt and completion text
            are kept for records whose own ``store_prompts`` (the principal's
            ``policy.store_prompts``) is None; otherwise the record's choice wins. Text
            that is not kept is removed before any sink sees the record.
    """

    def __init__(self, runners: list[SinkRunner] | None = None, *, store_prompts: bool = False):
        self.runners = list(runners or [])
        self._required = [r for r in self.runners if r.required]
        self.store_prompts = store_prompts
        self.emitted = 0
        self._confirming = [r for r in self.runners if r.commit_wait_s > 0]

    @property
    def commit_wait(self) -> bool:
        """True when some sink confirms writes (``commit_wait_s`` > 0)."""
        return bool(self._confirming)

    async def wait_written(self, record: RequestRecord) -> None:
        """Wait until every confirming sink has written ``record`` (each at most its
        ``commit_wait_s``); call right after :meth:`emit`. Never raises."""
        futures = [(r, r.expect(record)) for r in self._confirming]  # before any await
        if len(futures) == 1:
            await futures[0][0].wait(record, futures[0][1])
        elif futures:
            await asyncio.gather(*(r.wait(record, f) for r, f in futures))

    def emit(self, record: RequestRecord) -> None:
        """Queue one request-log record (prompt text dropped unless allowed)."""
        keep = self.store_prompts if record.store_prompts is None else record.store_prompts
        if (record.prompt_text is not None or record.completion_text is not None) and not keep:
            record.prompt_text = None
            record.completion_text = None
        self.emitted += 1
        for r in self.runners:
            r.put(record)

    def audit(self, event: AuditEvent) -> None:
        """Queue one audit event (``at`` defaults to now, UTC)."""
        if event.at is None:
            event.at = datetime.now(UTC)
        for r in self.runners:
            r.put(event)

    def check_admission(self) -> None:
        """Raise ServiceUnavailableError (503) while a required sink is exhausted."""
        for r in self._required:
            if r.refusing:
                why = "its buffer is full" if r.exhausted else "it fails closed at once"
                raise ServiceUnavailableError(
                    f"Request logging is unavailable (sink {r.name!r} cannot write and {why}); "
                    "the server does not accept requests it cannot record. Retry later.",
                    code=FAIL_CLOSED_CODE,
                    headers={"Retry-After": str(r.retry_after_s)},
                )

    @property
    def healthy(self) -> bool:
        """True when every required sink is writing (a readiness signal)."""
        return not self.unready_sinks()

    def unready_sinks(self) -> dict[str, str]:
        """``{name: reason}`` of each required sink that cannot record now.

        A sink cannot record from its first failed write until a write succeeds again
        (``reason`` names the last error), or while it is exhausted.
        """
        out: dict[str, str] = {}
        for r in self._required:
            if not r.healthy:
                out[r.name] = f"sink cannot write: {r.last_error or 'unknown error'}"
            elif r.exhausted:
                out[r.name] = "sink buffer and spill file are full"
        return out

    def stats(self) -> list[dict[str, Any]]:
        """Per-sink counters (queued, spilled bytes, written, dropped, failures)."""
        return [r.stats() for r in self.runners]

    async def close(self) -> None:
        """Flush every sink (bounded by each runner's ``close_timeout_s``) and close."""
        for r in self.runners:
            await r.close()


def config_digest(dump: dict[str, Any]) -> str:
    """sha256 hex of a config dump as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(dump, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def startup_events(settings: Settings, plugins: PluginHost) -> list[AuditEvent]:
    """The ``config.loaded`` and ``plugins.loaded`` audit events (secrets masked)."""
    from servehall.config.settings import masked_dump

    dump = masked_dump(settings)
    loaded = [
        {"name": p["name"], "version": p["version"], "distribution": p["distribution"]}
        for p in plugins.describe()
        if p["loaded"]
    ]
    return [
        AuditEvent(
            action="config.loaded",
            target="servehall",
            details={"sha256": config_digest(dump), "config": dump},
        ),
        AuditEvent(
            action="plugins.loaded",
            target="servehall",
            details={"enabled": list(settings.plugins.enabled), "loaded": loaded},
        ),
    ]


def _spill_default(name: str, index: int, taken: set[str]) -> str:
    base = f"servehall-spill-{name}.jsonl"
    if base in taken:
        base = f"servehall-spill-{name}-{index}.jsonl"
    taken.add(base)
    return base


async def open_record_bus(
    settings: Settings, plugins: PluginHost, *, startup_audit: bool = True
) -> RecordBus:
    """Build, start and return the bus for this deployment (see module docstring).

    ``startup_audit=False`` skips the ``config.loaded``/``plugins.loaded`` events (for
    short-lived CLI commands that only want to write their own audit events).

    Raises:
        ConfigError: an unknown sink name, bad sink options, an un-migrated or
            unreachable database, or a sink that refuses to start.
    """
    registry = plugins.sinks()
    runners: list[SinkRunner] = []
    taken: set[str] = set()
    try:
        for i, sc in enumerate(settings.sinks):
            spec = registry.get(sc.name)
            options = dict(sc.options)
            runner_opts = {k: options.pop(k) for k in RUNNER_OPTIONS if k in options}
            runner_opts.setdefault("spill_path", _spill_default(sc.name, i, taken))
            try:
                sink = spec.factory(options, settings)
            except ConfigError as exc:
                raise ConfigError(f"sinks[{i}] ({sc.name}).options: {exc.message}") from None
            except ServehallError:
                raise
            except Exception as exc:
                raise ConfigError(f"sinks[{i}] ({sc.name}): {exc}") from None
            sink.required = sc.required
            try:
                runner = SinkRunner(sink, required=sc.required, **runner_opts)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"sinks[{i}] ({sc.name}).options: {exc}") from None
            try:
                await runner.start()
            except ServehallError:
                raise
            except Exception as exc:
                raise ConfigError(
                    f"sinks[{i}] ({sc.name}): cannot start: {type(exc).__name__}: {exc}"
                ) from None
            runners.append(runner)
    except BaseException:
        for r in runners:
            await r.close()
        raise
    bus = RecordBus(runners, store_prompts=settings.database.store_prompts)
    if startup_audit:
        for ev in startup_events(settings, plugins):
            bus.audit(ev)
    return bus


__all__ = ["RecordBus", "open_record_bus", "startup_events"]
