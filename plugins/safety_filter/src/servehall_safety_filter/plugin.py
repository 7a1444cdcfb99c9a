"""Entry module of the ``safety_filter`` plugin (entry point ``safety_filter``).

Hooks: ``servehall_settings_models`` (the ``[safety_filter]`` section),
``servehall_input_filters`` (compiles every policy once, at startup),
``servehall_startup`` (same, from the host's settings, if not done yet) and
``servehall_output_filters`` (a fresh :class:`SafetyStreamFilter` per choice, for the
principal's tenant's policy; none when that policy has no output rules).

``servehall_output_filters`` receives no settings, so the compiled :class:`PolicyBook`
is kept in this module (one deployment per process; the last configuration wins).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from servehall import (
    AdmissionRequest,
    Host,
    InputFilter,
    OutputStreamFilter,
    PluginError,
    Principal,
    Settings,
    hookimpl,
)
from servehall_safety_filter.settings import SafetyFilterSettings

if TYPE_CHECKING:
    from servehall_safety_filter.policy import PolicyBook

SERVEHALL_HOOK_API = (1, 2)
SECTION = "safety_filter"

log = logging.getLogger("servehall.safety_filter")
_lock = threading.Lock()
_state: dict[str, Any] = {}


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


def configure(settings: Settings) -> PolicyBook:
    """Compile the policies of ``settings`` (once per settings object) and keep them.

    Raises:
        PluginError: a rule cannot be compiled (the message names the rule).
    """
    from servehall_safety_filter.policy import PolicyBook

    cfg = section_settings(settings)
    with _lock:
        book = _state.get("book")
        if _state.get("cfg") is cfg and book is not None:
            return book
        try:
            book = PolicyBook(cfg)
        except ValueError as exc:
            raise PluginError(f"[safety_filter]: {exc}") from None
        _state.update(cfg=cfg, book=book)
        log.info(
            "safety_filter: %d rule(s), policies %s (default %s)",
            len(cfg.rules),
            sorted(book.policies),
            cfg.default_policy,
        )
        return book


def current_book() -> PolicyBook | None:
    """The compiled policies, or None before :func:`configure` ran."""
    book: PolicyBook | None = _state.get("book")
    return book


@hookimpl
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]]:
    """The ``[safety_filter]`` section model."""
    return [(SECTION, SafetyFilterSettings)]


@hookimpl
def servehall_input_filters(settings: Settings) -> list[InputFilter]:
    """Compile the policies; return the prompt filter when some policy filters input."""
    from servehall_safety_filter.input_filter import SafetyInputFilter

    book = configure(settings)
    return [SafetyInputFilter(book)] if book.has_input_rules else []


@hookimpl
def servehall_startup(host: Host) -> None:
    """Compile the policies from the host's settings (no-op when already done)."""
    configure(host.settings)


@hookimpl
def servehall_output_filters(
    request: AdmissionRequest, principal: Principal
) -> list[OutputStreamFilter]:
    """A fresh stream filter for one choice under the principal's policy.

    Raises:
        PluginError: called before the plugin was configured (fail closed).
    """
    from servehall_safety_filter.stream import SafetyStreamFilter

    book = current_book()
    if book is None:
        raise PluginError("safety_filter: output filters requested before startup")
    rules = book.for_principal(principal).output
    return [SafetyStreamFilter(rules)] if rules else []
