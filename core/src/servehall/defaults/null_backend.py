"""Default plugin: backend ``null`` — tokens at a configured pace, no model (benchmarks).

Never chosen by ``backend = "auto"`` (``auto_priority=None``); name it explicitly::

    [[models]]
    name = "null"
    path = "~/.cache/servehall/demo-model"   # only its tokenizer and config.json are read
    backend = "null"
    options = { tokens_per_s = 50, step_time_ms = 20 }

See :mod:`servehall.engines.null` for the options and the pacing rules.
"""

from __future__ import annotations

from servehall.engines.backends import BackendRegistry, BackendSpec, ProbeResult
from servehall.engines.null import null_engine_factory
from servehall.plugin.hookimpl import hookimpl


def probe_null() -> ProbeResult:
    """Always available: the null engine needs no device and no library."""
    return ProbeResult(True, "no device needed (benchmarks and tests only; never chosen by auto)")


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "null",
            probe_null,
            null_engine_factory,
            auto_priority=None,
            description="emits the prompt's tokens at a configured pace without a model "
            "(benchmarks: the platform's own cost)",
        )
    )
