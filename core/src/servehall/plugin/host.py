"""The running host: settings, plugins, engines, schedulers and the record bus.

One :class:`Host` lives per ``servehall serve`` process; the Starlette app reaches it as
``request.app.state.host``. Plugins receive it as ``host`` in every hook that needs
state (hook API 2.0).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servehall.admission.demand import OnlineDemand
from servehall.config.settings import Settings
from servehall.plugin.manager import PluginHost
from servehall.plugin.outcomes import Breach, OutcomeWindow
from servehall.plugin.state import PluginState
from servehall.replica import replica_name
from servehall.tools.parsers import HERMES, ToolParser

if TYPE_CHECKING:
    from servehall.admission.filters import InputFilter
    from servehall.admission.scheduler import Scheduler
    from servehall.config.models import ModelConfig, RollbackIf
    from servehall.engines.contract import Engine
    from servehall.tools.plan import ToolGrammar


def model_key(name: str, version: str) -> str:
    """The key of one version in :attr:`Host.models`: ``name``, or ``name@version``."""
    return f"{name}@{version}" if version else name


@dataclass
class ServedModel:
    """One version of a model the host serves: its config name, version label, weight,
    engine, scheduler, tokenizer and the tool parser that reads its tool calls
    (``[[models]] tool_parser``).

    ``state``: ``serving`` (takes requests), ``loading`` (a live config change is
    starting it: no routed traffic yet), ``draining`` (removed by a config change: no new
    requests, streams finish), ``removed``, or ``unloaded`` (idle: its engine stopped;
    the next request loads it, :mod:`servehall.rollout.idle`). ``config`` is its
    ``[[models]]`` entry; ``last_used`` (monotonic) the last request's start or end;
    ``loads`` / ``last_load_s`` count engine starts and time the last one.
    ``inflight`` counts requests routed to it that have not ended (a draining version
    stops once it is 0); ``outcomes`` its recent finished requests
    (:mod:`servehall.rollout.guard`).
    """

    name: str
    backend: str
    engine: Engine
    scheduler: Scheduler
    tokenizer: Any
    max_model_len: int
    tool_parser: ToolParser = HERMES
    #: ``[[models]] tool_call_grammar`` (:data:`servehall.tools.plan.ToolGrammar`).
    tool_call_grammar: ToolGrammar = "strict"
    version: str = ""
    weight: float = 1.0
    state: str = "serving"
    inflight: int = 0
    rollback_if: RollbackIf | None = None
    outcomes: OutcomeWindow = field(default_factory=lambda: OutcomeWindow(300.0))
    config: ModelConfig | None = None
    last_used: float = field(default_factory=time.monotonic)
    loads: int = 0
    last_load_s: float = 0.0
    load_task: asyncio.Task[None] | None = None
    #: Called once when the engine is stopped (:func:`servehall.host.versions.stop_engine`):
    #: e.g. the release of a pulled model's cache lease.
    on_stop: list[Callable[[], None]] = field(default_factory=list)

    @property
    def key(self) -> str:
        """This version's key in :attr:`Host.models` (:func:`model_key`)."""
        return model_key(self.name, self.version)


@dataclass
class Host:
    """Everything a request needs, built once at startup.

    Attributes:
        settings: the validated effective config.
        plugins: the plugin host (typed hook calls).
        models: served model versions by key (:func:`model_key`: ``name`` or
            ``name@version``); :meth:`served_names` lists the names clients use.
        input_filters: filters from ``servehall_input_filters``.
        records: the record bus (``emit(RequestRecord)``, ``audit(AuditEvent)``); None
            until the records layer starts.
        state: each plugin's own state, keyed by class (:class:`PluginState`:
            ``host.state.put(obj)``, ``host.state.get(Cls)``, ``host.state.require(Cls)``).
        replica: this replica's name (``[server] replica`` or ``<hostname>-<pid>``),
            stored in every request-log row.
        on_canary_rollback: called (on the event loop, must not block) when the canary
            guard set a version's weight to 0 (:mod:`servehall.rollout.guard`); the
            live config stores it as a config revision. None: the rollback stays in
            this process.
        pulls: versions (by key) whose model is being pulled from its source now, with
            where the pull stands (``pulling 3/7 files, …`` or the retry's reason); shown
            by ``/health/ready`` (:mod:`servehall.host.versions`).
        online: online requests asking for or holding a slot on this replica
            (:class:`~servehall.admission.demand.OnlineDemand`; the batch runner yields
            to them).
    """

    settings: Settings
    plugins: PluginHost
    models: dict[str, ServedModel] = field(default_factory=dict)
    input_filters: list[InputFilter] = field(default_factory=list)
    records: Any = None
    state: PluginState = field(default_factory=PluginState)
    replica: str = ""
    on_canary_rollback: Callable[[ServedModel, Breach], None] | None = None
    pulls: dict[str, str] = field(default_factory=dict)
    online: OnlineDemand = field(default_factory=OnlineDemand)

    def served_names(self) -> list[str]:
        """The model names clients may send, in configured order, once each."""
        return list(dict.fromkeys(s.name for s in self.models.values() if s.state != "removed"))

    def __post_init__(self) -> None:
        if not self.replica:
            server = getattr(self.settings, "server", None)
            self.replica = replica_name(getattr(server, "replica", None))
