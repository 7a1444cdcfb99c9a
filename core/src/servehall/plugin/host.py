"""The running host: settings, plugins, engines, schedulers and the record bus.

One :class:`Host` lives per ``servehall serve`` process; the Starlette app reaches it as
``request.app.state.host``. Plugins receive it as ``host`` in every hook that needs
state (hook API 2.0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servehall.config.settings import Settings
from servehall.plugin.manager import PluginHost
from servehall.plugin.state import PluginState
from servehall.replica import replica_name
from servehall.tools.parsers import HERMES, ToolParser

if TYPE_CHECKING:
    from servehall.admission.filters import InputFilter
    from servehall.admission.scheduler import Scheduler
    from servehall.engines.contract import Engine


@dataclass
class ServedModel:
    """A model the host serves: its config name, engine, scheduler, tokenizer and the
    tool parser that reads its tool calls (``[[models]] tool_parser``)."""

    name: str
    backend: str
    engine: Engine
    scheduler: Scheduler
    tokenizer: Any
    max_model_len: int
    tool_parser: ToolParser = HERMES


@dataclass
class Host:
    """Everything a request needs, built once at startup.

    Attributes:
        settings: the validated effective config.
        plugins: the plugin host (typed hook calls).
        models: served models by name.
        input_filters: filters from ``servehall_input_filters``.
        records: the record bus (``emit(RequestRecord)``, ``audit(AuditEvent)``); None
            until the records layer starts.
        state: each plugin's own state, keyed by class (:class:`PluginState`:
            ``host.state.put(obj)``, ``host.state.get(Cls)``, ``host.state.require(Cls)``).
        replica: this replica's name (``[server] replica`` or ``<hostname>-<pid>``),
            stored in every request-log row.
    """

    settings: Settings
    plugins: PluginHost
    models: dict[str, ServedModel] = field(default_factory=dict)
    input_filters: list[InputFilter] = field(default_factory=list)
    records: Any = None
    state: PluginState = field(default_factory=PluginState)
    replica: str = ""

    def __post_init__(self) -> None:
        if not self.replica:
            server = getattr(self.settings, "server", None)
            self.replica = replica_name(getattr(server, "replica", None))
