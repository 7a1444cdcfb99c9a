"""Entry module of the ``safety_filter`` plugin (entry point ``safety_filter``).

Hooks: ``servehall_settings_models`` (the ``[safety_filter]`` section),
``servehall_input_filters`` (compiles every policy once, at startup, and keeps the
compiled :class:`PolicyBook` on ``host.state``), ``servehall_startup`` (same, if not
done yet) and ``servehall_output_filters`` (a fresh :class:`SafetyStreamFilter` per
choice, for the principal's tenant's policy; none when that policy has no output rules).
State lives on the host that runs the hooks, never in this module.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

from servehall import (
    AdmissionRequest,
    Host,
    InputFilter,
    OutputStreamFilter,
    PluginError,
    Settings,
    hookimpl,
)
from servehall_safety_filter.policy import PolicyBook
from servehall_safety_filter.settings import SafetyFilterSettings

SERVEHALL_HOOK_API = "2"
SECTION = "safety_filter"

log = logging.getLogger("servehall.safety_filter")


def section_settings(settings: Settings) -> SafetyFilterSettings:
    """The validated ``[safety_filter]`` section (defaults when absent)."""
    raw = settings.section(SECTION)
    if isinstance(raw, SafetyFilterSettings):
        return raw
    if raw is None:
        return SafetyFilterSettings()
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    return SafetyFilterSettings.model_validate(raw)


def configure(host: Host) -> PolicyBook:
    """Compile the policies of ``host.settings`` once and keep them on ``host.state``.

    Raises:
        PluginError: a rule cannot be compiled (the message names the rule).
    """
    book = host.state.get(PolicyBook)
    if book is not None:
        return book
    cfg = section_settings(host.settings)
    try:
        book = PolicyBook(cfg)
    except ValueError as exc:
        raise PluginError(f"[safety_filter]: {exc}") from None
    host.state.put(book)
    log.info(
        "safety_filter: %d rule(s), policies %s (default %s)",
        len(cfg.rules),
        sorted(book.policies),
        cfg.default_policy,
    )
    return book


@hookimpl
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]]:
    """The ``[safety_filter]`` section model."""
    return [(SECTION, SafetyFilterSettings)]


@hookimpl
def servehall_input_filters(host: Host) -> list[InputFilter]:
    """Compile the policies; return the prompt filter when some policy filters input."""
    from servehall_safety_filter.input_filter import SafetyInputFilter

    book = configure(host)
    return [SafetyInputFilter(book)] if book.has_input_rules else []


@hookimpl
def servehall_startup(host: Host) -> None:
    """Compile the policies from the host's settings (no-op when already done)."""
    configure(host)


@hookimpl
def servehall_output_filters(host: Host, admission: AdmissionRequest) -> list[OutputStreamFilter]:
    """A fresh stream filter for one choice under the caller's policy.

    Raises:
        PluginError: called before the plugin was configured (fail closed).
    """
    from servehall_safety_filter.stream import SafetyStreamFilter

    book = host.state.get(PolicyBook)
    if book is None:
        raise PluginError("safety_filter: output filters requested before startup")
    rules = book.for_principal(admission.principal).output
    return [SafetyStreamFilter(rules)] if rules else []
