"""servehall — a plugin-based serving platform for large language models.

The public API for plugins is exactly the names in ``__all__``; anything else is internal.
"""

from servehall.backends import BackendRegistry, BackendSpec, ProbeResult
from servehall.bootstrap import load_deployment
from servehall.config import ModelConfig, Secret, Settings, load_settings
from servehall.engine import (
    Engine,
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    TokenDelta,
)
from servehall.errors import (
    AuthenticationError,
    ConfigError,
    ContentFilterError,
    EngineError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PluginError,
    RateLimitError,
    ServehallError,
    ServiceUnavailableError,
)
from servehall.filters import (
    FilterVerdict,
    InputFilter,
    OutputStreamFilter,
    PromptParts,
    StreamFilterResult,
)
from servehall.hookimpl import hookimpl
from servehall.host import Host, ServedModel
from servehall.principal import ANONYMOUS, SCOPE_ADMIN, SCOPE_INFERENCE, Principal
from servehall.records.bus import open_record_bus
from servehall.records.types import AuditEvent, RequestRecord, Sink, SinkSpec
from servehall.registries import SchedulerRegistry, SinkRegistry
from servehall.routes import RouteRegistry
from servehall.scheduling import Scheduler, SchedulerSpec, Slot, Ticket
from servehall.usage import AdmissionRequest, Reservation
from servehall.version import HOOK_API_VERSION, __version__

__all__ = [
    "ANONYMOUS",
    "HOOK_API_VERSION",
    "SCOPE_ADMIN",
    "SCOPE_INFERENCE",
    "AdmissionRequest",
    "AuditEvent",
    "AuthenticationError",
    "BackendRegistry",
    "BackendSpec",
    "ConfigError",
    "ContentFilterError",
    "Engine",
    "EngineError",
    "EngineHealth",
    "EngineStats",
    "FilterVerdict",
    "Host",
    "InputFilter",
    "InvalidRequestError",
    "ModelConfig",
    "ModelInfo",
    "NotFoundError",
    "OutputStreamFilter",
    "PermissionDeniedError",
    "PluginError",
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
    "StreamFilterResult",
    "Ticket",
    "TokenDelta",
    "__version__",
    "hookimpl",
    "load_deployment",
    "load_settings",
    "open_record_bus",
]
