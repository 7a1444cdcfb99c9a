"""Config changes without a restart: validate a new config, then apply the difference.

Triggers: ``POST /admin/config`` (admin scope), SIGHUP (re-reads the server's own
file), and — with ``[server] config_revisions = true`` — a new row in ``config_revision``
(written by ``servehall config apply`` / ``config rollback`` or another replica), which
every replica polls every ``config_poll_s`` seconds, and at once when it is announced
over Redis (``[server] config_broadcast_url``, :mod:`servehall.rollout.broadcast`).

What can change live is ``[[models]]``: versions added, versions removed, weights.
Everything else (bind addresses, TLS, database URL, plugins, sinks, scheduler, plugin
sections) needs a restart; a direct change of it is refused with one error per key. A
revision that a replica follows from the database applies only its ``[[models]]``
(replicas may differ in ``[server] replica`` or ``bind``); other differences are logged.
A running version changes only ``weight``, ``rollback_if`` and ``idle_unload_s`` live: another path,
backend or options is a new version label.

A canary the guard rolled back (:mod:`servehall.rollout.guard`) is stored as a revision
by :meth:`LiveConfig.canary_rolled_back`, which every replica follows; every config
applied or stored afterwards keeps that rollback unless it sets the version's weight
explicitly (:mod:`servehall.rollout.sticky`).

Order, everything-or-nothing: validate everything (every error in one list, as
``servehall config check`` does), then start each new version's engine with state
``loading`` (the router sends it nothing) and run the readiness probe; if any fails,
the started ones are shut down and nothing changed. Then, at once: weights change, new
versions take traffic, removed versions turn ``draining`` (no new requests; their
in-flight requests finish) and are shut down when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servehall.config.check import check_config_data
from servehall.config.models import ModelConfig
from servehall.config.redact import redact_text, restore_secrets
from servehall.config.settings import (
    Settings,
    config_format,
    load_settings,
    parse_config_text,
)
from servehall.errors import ConfigError
from servehall.plugin.host import model_key
from servehall.plugin.outcomes import OutcomeWindow
from servehall.rollout import revisions, sticky
from servehall.rollout.broadcast import announce, redis_client, revision_listener
from servehall.rollout.guard import audit_details
from servehall.rollout.revisions import text_hash

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from servehall.plugin.host import Host, ServedModel
    from servehall.plugin.outcomes import Breach
    from servehall.pubsub import ChannelListener
    from servehall.serving.probe import Readiness

log = logging.getLogger("servehall.config")

_LIVE_FIELDS = frozenset({"weight", "rollback_if", "idle_unload_s", "rolled_back"})
_STORE_RETRY_S = (1.0, 30.0)  # a rollback not stored yet is retried: first and longest pause


@dataclass
class ApplyResult:
    """What an apply changed (version keys ``name`` / ``name@version``); ``kept``: the
    canaries it left rolled back at weight 0 (:mod:`servehall.rollout.sticky`)."""

    revision: int | None = None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reweighted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (the admin route's answer)."""
        return {
            "revision": self.revision,
            "added": self.added,
            "removed": self.removed,
            "reweighted": self.reweighted,
            "kept_rollbacks": self.kept,
        }


def _refuse(errs: list[tuple[str, str]]) -> ConfigError:
    lines = "\n".join(f"  {k}: {m}" for k, m in errs)
    return ConfigError(f"config not applied, nothing changed: {len(errs)} error(s):\n{lines}", errs)


class StartRefused(ConfigError):
    """A config refused because a new version failed to start, its readiness probe or
    its accuracy gate; ``gates`` holds the failed gates' figures by version key."""

    def __init__(self, errs: list[tuple[str, str]], gates: dict[str, dict[str, Any]]) -> None:
        base = _refuse(errs)
        super().__init__(base.message, errs)
        self.gates = gates


def non_live_changes(base: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key path, message)`` for each setting outside ``[[models]]`` that differs
    between the running config ``base`` and ``new`` (raw parsed files)."""
    errs: list[tuple[str, str]] = []
    for section in sorted((set(base) | set(new)) - {"models"}):
        old, now = base.get(section), new.get(section)
        if old == now:
            continue
        if isinstance(old, dict) and isinstance(now, dict):
            keys = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
        else:
            keys = [""]
        for key in keys:
            path = f"{section}.{key}" if key else section
            errs.append((path, "cannot change without a restart (live: [[models]] only)"))
    return errs


def version_changes(
    running: dict[str, ModelConfig], new: list[ModelConfig]
) -> list[tuple[str, str]]:
    """Errors for running versions whose new entry changes more than ``weight`` and
    ``rollback_if``."""
    errs: list[tuple[str, str]] = []
    for i, mc in enumerate(new):
        old = running.get(model_key(mc.name, mc.version))
        if old is None:
            continue
        a, b = old.model_dump(exclude=set(_LIVE_FIELDS)), mc.model_dump(exclude=set(_LIVE_FIELDS))
        changed = sorted(k for k in a if a[k] != b[k])
        if changed:
            label = f"version {mc.version!r} of model" if mc.version else "model"
            errs.append(
                (
                    f"models[{i}]",
                    f"{label} {mc.name!r} is running: only weight, rollback_if and "
                    f"idle_unload_s change live (changed: {', '.join(changed)}); "
                    "give the change a new version label",
                )
            )
    return errs


class LiveConfig:
    """The running config of one replica and the live way to change it.

    :attr:`text` (and :attr:`hash`, the revision's hash) is the config's stored form:
    literal secrets replaced by ``{ redacted = true }`` (:mod:`servehall.config.redact`);
    :attr:`base` is the running config as parsed, with its real secrets, kept only in
    memory (redacted secrets of a revision applied later are taken from it).

    Args:
        host: the running host.
        readiness: probes a new version before it takes traffic.
        text: the config text the server started with; ``fmt``: ``toml`` or ``yaml``.
        path: the server's config file (SIGHUP re-reads it), or None.
    """

    def __init__(
        self, host: Host, readiness: Readiness, text: str, fmt: str, path: Path | None
    ) -> None:
        self.host = host
        self.readiness = readiness
        self.fmt = fmt
        self.path = path
        self.base = parse_config_text(text, fmt) if text else {}
        self.text = redact_text(text, fmt, host.settings)
        self.hash = text_hash(self.text)
        self.revision = 0
        self.last_error: str | None = None
        self.db: AsyncEngine | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poll: asyncio.Task[None] | None = None
        self.listener: ChannelListener | None = None
        self._nudge: asyncio.Event | None = None
        host.on_canary_rollback = self.canary_rolled_back

    # --- validation ----------------------------------------------------------------------

    def validate(
        self, data: dict[str, Any], *, follow: bool = False
    ) -> tuple[Settings, dict[str, Any]]:
        """The new settings and the data they came from (secrets restored), or
        ConfigError listing every problem (nothing changes).

        ``data`` may hold redacted secrets (a stored revision): they are taken from the
        running config (ConfigError naming each one it has no value for).
        ``follow``: take only ``[[models]]`` from ``data`` (a revision from the database);
        otherwise any other difference from the running config is an error.
        """
        if follow:
            stored = parse_config_text(self.text, self.fmt) if self.text else {}
            others = non_live_changes(stored, data)
            if others:
                log.warning(
                    "revision differs outside [[models]] (%s): only [[models]] apply live",
                    ", ".join(k for k, _ in others),
                )
            data = {**self.base, "models": data.get("models", [])}
        try:
            data = restore_secrets(data, self.base)
        except ConfigError as exc:
            raise _refuse(exc.errors or [("config", exc.message)]) from None
        errs = check_config_data(data)
        if not follow:
            errs.extend(non_live_changes(self.base, data))
        new: Settings | None = None
        if not errs:
            try:
                new = load_settings(data=data, section_models=self.host.plugins.settings_models())
            except ConfigError as exc:
                errs.extend(exc.errors or [("config", exc.message)])
        if new is not None:
            if not new.models:
                errs.append(("models", "no [[models]] configured"))
            running = {
                model_key(m.name, m.version): m
                for m in self.host.settings.models
                if model_key(m.name, m.version) in self.host.models
            }
            errs.extend(version_changes(running, new.models))
        if errs:
            raise _refuse(errs)
        assert new is not None
        return new, data

    # --- applying ------------------------------------------------------------------------

    async def apply_text(
        self,
        text: str,
        fmt: str,
        applied_by: str,
        *,
        follow_revision: int | None = None,
        action: str = "config.applied",
    ) -> ApplyResult:
        """Validate and apply config ``text`` (see the module docstring).

        With revisions on, a direct apply is stored as a new revision (audited; literal
        secrets redacted); a followed one (``follow_revision``) is already stored. A
        direct apply keeps the guard's rollbacks of the newest stored config (or, without
        revisions, of the running one) unless it sets those weights
        (:func:`servehall.rollout.sticky.keep`).

        Raises:
            ConfigError: invalid, not live-applicable, or a new version failed to start or
                pass its probe (``errors`` lists every problem; nothing changed).
        """
        async with self._lock:
            kept: list[str] = []
            if follow_revision is None:
                # a text that does not parse is a ConfigError here, before the rollback
                # step edits it (its own parser's errors are no ConfigError)
                parse_config_text(text, fmt)
                text, kept = await self._keep_rollbacks(text, fmt)
            data = parse_config_text(text, fmt)
            new, data = self.validate(data, follow=follow_revision is not None)
            stored = text if follow_revision is not None else redact_text(text, fmt, new)
            try:
                result = await self._apply(new)
            except StartRefused as exc:
                await self._audit_refusal(exc, applied_by, follow_revision)
                raise
            result.kept = kept
            if follow_revision is not None:
                self.revision = follow_revision
            elif self.db is not None:
                rev = await revisions.record(
                    self.db, stored, fmt, applied_by, action=action, details=result.as_dict()
                )
                self.revision = rev.revision
                if self.listener is not None:
                    await announce(self.listener.client, rev.revision)
            self.base = {**self.base, "models": data.get("models", [])}
            self.text, self.fmt, self.hash = stored, fmt, text_hash(stored)
            result.revision = self.revision or None
            self.last_error = None
            log.info(
                "config applied (revision %s, by %s): added %s, removed %s, weights %s",
                result.revision,
                applied_by,
                result.added or "-",
                result.removed or "-",
                result.reweighted or "-",
            )
            return result

    async def _apply(self, new: Settings) -> ApplyResult:
        from servehall.host.gate import GateFailed
        from servehall.host.versions import start_version, stop_engine

        host = self.host
        result = ApplyResult()
        wanted = {model_key(mc.name, mc.version): mc for mc in new.models}
        started: list[ServedModel] = []
        errs: list[tuple[str, str]] = []
        gates: dict[str, dict[str, Any]] = {}
        for key, mc in wanted.items():
            current = host.models.get(key)
            if current is not None and current.state in (
                "serving",
                "loading",
                "draining",
                "unloaded",
            ):
                continue
            try:
                served = await start_version(host, mc, state="loading")
            except Exception as exc:
                if isinstance(exc, GateFailed):
                    gates[key] = exc.report.figures()
                errs.append((f"models.{key}", f"cannot start: {getattr(exc, 'message', exc)}"))
                continue
            started.append(served)
            host.models[key] = served
            if not await self.readiness.probe(served):
                errs.append(
                    (
                        f"models.{key}",
                        f"readiness probe failed: {self.readiness.last_error.get(key)}",
                    )
                )
        if errs:
            for served in started:
                if host.models.get(served.key) is served:
                    del host.models[served.key]
                await stop_engine(served)
            raise StartRefused(errs, gates)
        # the switch: from here on nothing awaits, so no request sees half of it
        for key, mc in wanted.items():
            served = host.models[key]
            if served in started:
                result.added.append(key)
            elif served.weight != mc.weight or served.state == "draining":
                result.reweighted.append(key)
            if served.weight == 0 and mc.weight > 0 and mc.rollback_if is not None:
                # back in rotation: judged on what it does from now on
                served.outcomes = OutcomeWindow(mc.rollback_if.window_s)
            served.weight = mc.weight
            served.rollback_if = mc.rollback_if
            served.config = mc
            if served.state != "unloaded":
                served.state = "serving"
        for key, served in list(host.models.items()):
            if key not in wanted and served.state in ("serving", "loading", "unloaded"):
                served.state = "draining"
                result.removed.append(key)
                self._spawn(self._drain(served))
        host.settings.models = list(new.models)
        return result

    async def _audit_refusal(
        self, exc: StartRefused, applied_by: str, follow_revision: int | None
    ) -> None:
        """Audit ``config.refused`` (actor ``applied_by``; target ``revision N`` for a
        followed revision, else ``config``; details: ``revision``, ``errors``, the failed
        gates' figures, ``replica``): in the database with revisions on (what ``config
        history`` lists beside the revisions), else through the record bus. A database
        error is logged, never raised: the refusal stands either way."""
        from servehall.records.types import AuditEvent

        event = AuditEvent(
            action="config.refused",
            actor=applied_by[:128],
            target=f"revision {follow_revision}" if follow_revision is not None else "config",
            details={
                "revision": follow_revision,
                "errors": [[k, m[:1000]] for k, m in exc.errors[:20]],
                "gates": exc.gates,
                "replica": self.host.replica,
            },
        )
        if self.db is None:
            if self.host.records is not None:
                self.host.records.audit(event)
            return
        try:
            await revisions.record_refusal(self.db, event)
        except Exception as err:
            log.warning("refused config not audited (%s: %s)", type(err).__name__, err)

    async def _drain(self, served: ServedModel) -> None:
        """Shut ``served`` down once its last in-flight request ended (unless re-added)."""
        from servehall.host.versions import stop_engine

        while served.state == "draining" and served.inflight > 0:
            await asyncio.sleep(0.2)
        if served.state != "draining":
            return  # a later config took it back
        served.state = "removed"
        log.info("model %s drained; stopping its engine", served.key)
        await stop_engine(served)
        if self.host.models.get(served.key) is served:
            del self.host.models[served.key]
        self.readiness.last_ok.pop(served.key, None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- canary rollbacks that stick ----------------------------------------------------

    async def _previous_models(self) -> list[Any]:
        """The ``[[models]]`` of the newest stored config (the running one without
        revisions)."""
        if self.db is not None:
            newest = await revisions.latest(self.db)
            if newest is not None:
                return list(parse_config_text(newest.text, newest.fmt).get("models") or [])
        return list(self.base.get("models") or [])

    async def _keep_rollbacks(self, text: str, fmt: str) -> tuple[str, list[str]]:
        """``text`` with the guard's rollbacks kept (:func:`sticky.keep`), and their keys."""
        text, kept = sticky.keep(text, fmt, await self._previous_models())
        if kept:
            log.warning(
                "config keeps the canary rollback of %s (weight 0): set its weight in the "
                "config to change it",
                ", ".join(kept),
            )
        return text, kept

    async def _keep_at_start(self, newest: revisions.Revision) -> None:
        """At start: keep the rollbacks of ``newest`` that the file does not override,
        in the running weights and in :attr:`text` (stored next)."""
        previous = parse_config_text(newest.text, newest.fmt).get("models") or []
        text, kept = sticky.keep(self.text, self.fmt, previous)
        if not kept:
            return
        new, data = self.validate(parse_config_text(text, self.fmt), follow=True)
        await self._apply(new)
        self.base = {**self.base, "models": data.get("models", [])}
        self.text, self.hash = text, text_hash(text)
        log.warning(
            "canary rollback of %s kept from revision %s (weight 0): set its weight in the "
            "config to change it",
            ", ".join(kept),
            newest.revision,
        )

    def canary_rolled_back(self, served: ServedModel, found: Breach) -> None:
        """The guard set ``served``'s weight to 0 here: store that as a config revision
        (:meth:`_store_rollback`); set as :attr:`Host.on_canary_rollback`."""
        self._spawn(self._store_rollback(served, found))

    async def _store_rollback(self, served: ServedModel, found: Breach) -> None:
        """Store the rollback until it is stored or moot: with revisions, as the next
        revision (``[[models]]`` of the newest one with the version at weight 0 and its
        ``rolled_back`` table; audited ``model.canary_rollback`` with the figures in the
        same transaction), announced and followed by every replica; without, in this
        replica's running config (audited on the record bus). A database error is
        retried while the version is still rolled back here."""
        pause = _STORE_RETRY_S[0]
        marker = found.marker(self.host.replica)
        while self.host.models.get(served.key) is served and served.weight == 0:
            try:
                await self._store_rollback_once(served, found, marker)
                return
            except ConfigError as exc:
                log.error("canary rollback of %s not stored: %s", served.key, exc.message)
                return
            except Exception as exc:
                log.warning(
                    "canary rollback of %s not stored yet (%s: %s); retrying in %g s",
                    served.key,
                    type(exc).__name__,
                    exc,
                    pause,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _STORE_RETRY_S[1])

    async def _store_rollback_once(
        self, served: ServedModel, found: Breach, marker: dict[str, Any]
    ) -> None:
        by = f"guard:{self.host.replica}"
        details = audit_details(found, self.host.replica)
        if self.db is None:
            async with self._lock:
                text = sticky.mark(self.text, self.fmt, served.name, served.version, marker)
            if text is not None:
                await self.apply_text(text, self.fmt, by)
            if self.host.records is not None:
                from servehall.records.types import AuditEvent

                self.host.records.audit(
                    AuditEvent(action="model.canary_rollback", target=served.key, details=details)
                )
            return
        async with self._lock:
            newest = await revisions.latest(self.db)
            base, fmt = (newest.text, newest.fmt) if newest is not None else (self.text, self.fmt)
            text = sticky.mark(base, fmt, served.name, served.version, marker)
            if text is None:  # already stored (another replica), or not in the newest config
                self._wake(None)
                return
            rev = await revisions.record(
                self.db,
                text,
                fmt,
                by,
                action="model.canary_rollback",
                target=served.key,
                details=details,
            )
            if self.listener is not None:
                await announce(self.listener.client, rev.revision)
        log.info("canary rollback of %s stored as config revision %s", served.key, rev.revision)
        self._wake(rev.revision)  # this replica follows it like any other revision

    # --- revisions, polling and SIGHUP --------------------------------------------------

    async def open_revisions(self, db: AsyncEngine, broadcast_url: str | None = None) -> None:
        """Start keeping revisions in ``db``: adopt the newest revision when it is this
        config, else store this config as a new one (every replica starting with the
        same file adopts the same revision); a canary the newest revision has rolled
        back stays so unless the file sets its weight (:mod:`servehall.rollout.sticky`).
        Then follow newer ones: poll, and with ``broadcast_url`` (Redis) also listen for
        announcements."""
        self.db = db
        self._nudge = asyncio.Event()
        newest = await revisions.latest(db)
        if newest is not None:
            await self._keep_at_start(newest)
        if newest is not None and newest.hash == self.hash:
            self.revision = newest.revision
        else:
            rev = await revisions.record(
                db,
                self.text,
                self.fmt,
                f"serve:{self.host.replica}",
                action="config.started",
                adopt_same=True,
            )
            self.revision = rev.revision
        if broadcast_url:
            self.listener = revision_listener(redis_client(broadcast_url), self._wake)
            await self.listener.start()
        self._poll = asyncio.get_running_loop().create_task(self._follow())

    def _wake(self, revision: int | None) -> None:
        """A revision was announced (None: maybe missed ones): look now."""
        if self._nudge is not None and (revision is None or revision > self.revision):
            self._nudge.set()

    async def _follow(self) -> None:
        interval = self.host.settings.server.config_poll_s
        failed = 0
        assert self._nudge is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):  # not wait_for: it may drop a cancel
                    await self._nudge.wait()
            self._nudge.clear()
            assert self.db is not None
            try:
                newest = await revisions.latest_number(self.db)
                if newest <= max(self.revision, failed):
                    continue
                rev = await revisions.get(self.db, newest)
                if rev is None:
                    continue
                if rev.hash == self.hash:
                    self.revision = rev.revision
                    continue
                await self.apply_text(
                    rev.text, rev.fmt, rev.applied_by, follow_revision=rev.revision
                )
            except ConfigError as exc:
                failed = newest
                self.last_error = f"revision {newest}: {exc.message}"
                log.error("config revision %s not applied: %s", newest, exc.message)
            except Exception as exc:  # a database hiccup: try again next round
                log.warning("config revision poll failed: %s", exc)

    def install_sighup(self) -> None:
        """SIGHUP re-reads :attr:`path` and applies it (errors are logged)."""
        if self.path is None:
            return
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))

    async def reload(self) -> ApplyResult | None:
        """Re-read the config file and apply it (SIGHUP); None when it was refused."""
        assert self.path is not None
        try:
            text = self.path.read_text(encoding="utf-8")
            return await self.apply_text(text, config_format(self.path), "signal:SIGHUP")
        except (ConfigError, OSError) as exc:
            self.last_error = getattr(exc, "message", str(exc))
            log.error("SIGHUP: %s", self.last_error)
            return None

    async def close(self) -> None:
        """Stop polling and wait for drains in progress (bounded by the engines' stop)."""
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
        for task in list(self._tasks):
            task.cancel()
        if self.listener is not None:
            await self.listener.close()
            with contextlib.suppress(Exception):
                await self.listener.client.aclose()
        if self.db is not None:
            await self.db.dispose()

    def report(self) -> dict[str, Any]:
        """The ``config`` part of ``/health/ready``."""
        out: dict[str, Any] = {"revision": self.revision or None, "hash": self.hash}
        if self.listener is not None:
            out["broadcast"] = self.listener.state()
        if self.last_error:
            out["last_error"] = self.last_error[:500]
        return out
