"""servehall — a plugin-based serving platform for large language models.

The public API for plugins is exactly the names in ``__all__`` of this module and of
the public modules listed in :data:`PUBLIC_MODULES` (``servehall.devices``: what device
plugins need from the shared torch engine; ``servehall.testing``: the conformance kit);
anything else is internal and may change without notice.
"""

from typing import TYPE_CHECKING, Any

from servehall.admission.filters import (
    FilterVerdict,
    InputFilter,
    OutputStreamFilter,
    PromptParts,
    StreamFilterResult,
)
from servehall.admission.principal import (
    ANONYMOUS,
    SCOPE_ADMIN,
    SCOPE_INFERENCE,
    Limits,
    Policy,
    Principal,
)
from servehall.admission.scheduler import Scheduler, SchedulerSpec, Slot, Ticket
from servehall.admission.usage import AdmissionRequest, Reservation
from servehall.config import ModelConfig, Secret, Settings, load_settings
from servehall.config.options import canonical_dtype, parse_model_options
from servehall.engines.backends import BackendRegistry, BackendSpec, ProbeResult
from servehall.engines.cache import build_atomically, installed_versions, servehall_cache_dir
from servehall.engines.contract import (
    EmbeddingEngine,
    Engine,
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    SpecDecodeStats,
    StructuredConstraint,
    TokenDelta,
)
from servehall.engines.conversion import run_converter, source_digest
from servehall.engines.embedbatch import (
    EmbedBatcher,
    EmbeddingEngineBase,
    padded_passes,
    refuse_generation,
)
from servehall.engines.kit import (
    DeltaStream,
    HfModelFacts,
    LiveStreams,
    StepSinkEngine,
    load_errors,
    stop_token_set,
)
from servehall.engines.pooling import PoolingConfig, embedding_facts, pool_numpy, read_pooling
from servehall.engines.step_thread import StepThreadEngine
from servehall.errors import (
    AuthenticationError,
    ConfigError,
    ContentFilterError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PluginError,
    RateLimitError,
    ServehallError,
    ServiceUnavailableError,
)
from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.metrics import plugin_counter
from servehall.plugin.migrations import MigrationBranch
from servehall.plugin.registries import (
    RouteRegistry,
    SchedulerRegistry,
    SinkRegistry,
    ToolParserRegistry,
)
from servehall.plugin.state import PluginState
from servehall.pubsub import ChannelListener
from servehall.records.bus import open_record_bus
from servehall.records.types import AuditEvent, RequestRecord, Sink, SinkSpec
from servehall.server.bootstrap import load_deployment
from servehall.structured.grammar import (
    GrammarCache,
    GrammarError,
    compile_then,
    constraint_ebnf,
)
from servehall.tools import CallFormat, ToolParser
from servehall.version import HOOK_API_VERSION, __version__

if TYPE_CHECKING:  # imported lazily below (SQLAlchemy is heavy): see __getattr__
    from servehall.db import (
        DbBase,
        DbTimeouts,
        UTCDateTime,
        create_db_engine,
        describe_database,
        require_existing_database,
    )

PUBLIC_MODULES: tuple[str, ...] = ("servehall", "servehall.devices", "servehall.testing")
"""Modules a plugin may import from (each one's ``__all__`` is its public API)."""

_LAZY = {
    name: "servehall.db"
    for name in (
        "DbBase",
        "DbTimeouts",
        "UTCDateTime",
        "create_db_engine",
        "describe_database",
        "require_existing_database",
    )
}


def __getattr__(name: str) -> Any:
    """Resolve the database helpers (``DbBase``, ``DbTimeouts``, ``UTCDateTime``,
    ``create_db_engine``…) from :mod:`servehall.db` on first attribute access, not
    while this package is being imported."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'servehall' has no attribute {name!r}")


__all__ = [
    "ANONYMOUS",
    "HOOK_API_VERSION",
    "PUBLIC_MODULES",
    "SCOPE_ADMIN",
    "SCOPE_INFERENCE",
    "AdmissionRequest",
    "AuditEvent",
    "AuthenticationError",
    "BackendRegistry",
    "BackendSpec",
    "CallFormat",
    "ChannelListener",
    "ConfigError",
    "ContentFilterError",
    "DbBase",
    "DbTimeouts",
    "DeltaStream",
    "EmbedBatcher",
    "EmbeddingEngine",
    "EmbeddingEngineBase",
    "Engine",
    "EngineError",
    "EngineHealth",
    "EngineStats",
    "EngineUnavailableError",
    "FilterVerdict",
    "GrammarCache",
    "GrammarError",
    "HfModelFacts",
    "Host",
    "InputFilter",
    "InvalidRequestError",
    "Limits",
    "LiveStreams",
    "MigrationBranch",
    "ModelConfig",
    "ModelInfo",
    "NotFoundError",
    "OutputStreamFilter",
    "PermissionDeniedError",
    "PluginError",
    "PluginState",
    "Policy",
    "PoolingConfig",
    "Principal",
    "ProbeResult",
    "PromptParts",
    "RateLimitError",
    "RequestRecord",
    "Reservation",
    "RouteRegistry",
    "SamplingParams",
    "Scheduler",
    "SchedulerRegistry",
    "SchedulerSpec",
    "Secret",
    "ServedModel",
    "ServehallError",
    "ServiceUnavailableError",
    "Settings",
    "Sink",
    "SinkRegistry",
    "SinkSpec",
    "Slot",
    "SpecDecodeStats",
    "StepSinkEngine",
    "StepThreadEngine",
    "StreamFilterResult",
    "StructuredConstraint",
    "Ticket",
    "TokenDelta",
    "ToolParser",
    "ToolParserRegistry",
    "UTCDateTime",
    "__version__",
    "build_atomically",
    "canonical_dtype",
    "compile_then",
    "constraint_ebnf",
    "create_db_engine",
    "describe_database",
    "embedding_facts",
    "hookimpl",
    "installed_versions",
    "load_deployment",
    "load_errors",
    "load_settings",
    "open_record_bus",
    "padded_passes",
    "parse_model_options",
    "plugin_counter",
    "pool_numpy",
    "read_pooling",
    "refuse_generation",
    "require_existing_database",
    "run_converter",
    "servehall_cache_dir",
    "source_digest",
    "stop_token_set",
]
