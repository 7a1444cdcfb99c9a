"""Device backends: how a plugin offers a device, and how the host picks one.

A plugin adds a :class:`BackendSpec` to the :class:`BackendRegistry` passed to
``servehall_register_backends``. ``probe()`` must be cheap and must not import heavy
libraries at module import time; it reports availability with a human reason
(``"torch.cuda.is_available() is False"``). Idea from vLLM's platform probing
(``vllm/platforms/__init__.py``), without its Platform god-class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.config.models import ModelConfig
    from servehall.config.worker import WorkerSettings
    from servehall.engines.contract import Engine


ACCELERATOR_PRIORITY = 100
"""``auto_priority`` at or above which a backend counts as an accelerator for ``auto``."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Whether a backend can run here, and why (or why not)."""

    available: bool
    reason: str


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A device backend.

    Attributes:
        name: the name used in config (``backend = "openvino_cpu"``).
        probe: ``() -> ProbeResult``; never raises (the registry turns exceptions into an
            unavailable result).
        factory: ``(model: ModelConfig) -> Engine``; builds an unstarted engine; may import
            heavy libraries.
        auto_priority: order for ``backend = "auto"``: larger wins; accelerators use
            >= 100, CPU backends < 100. ``None`` excludes the backend from ``auto``.
        description: one line for ``servehall plugins``.
        prepare: ``(model: ModelConfig) -> None`` or None: builds what the engine needs
            on disk (a converted model) *before* its worker process starts — in the API
            process, on a thread, outside the worker's ``start_timeout_s`` — so a
            conversion of minutes is not cut short by the start window, and the worker
            only loads. Must be idempotent and safe across processes (use
            :func:`~servehall.build_atomically`), must not load the model, and raises
            ConfigError / EngineError like ``start()``. Only used with
            ``isolation = "process"`` (a thread engine builds in its own ``start()``).
            None: the factory's ``prepare`` method if it has one (the factories of
            :func:`~servehall.engines.select.engine_factory` do: the ONNX Runtime engine
            builds its ONNX model there), else none (see :meth:`prepare_step`).
        worker_defaults: ``(model) -> {key: value}``: the engine's own defaults for
            ``[[models]] worker`` keys the config leaves unset (e.g. the vLLM engine's
            ``heartbeat_timeout_s = 10``); cheap, called in the API process. None: the
            factory's ``worker_defaults`` method if it has one (the factories of
            :func:`~servehall.engines.select.engine_factory` do), else none.
        check_options: ``(model) -> None`` or None: validates ``[[models]] options``
            when the config is loaded or checked (``servehall config check``), raising
            ConfigError whose ``errors`` name the keys; cheap and import-light (no engine
            library). None: options are only checked when the engine is built.
    """

    name: str
    probe: Callable[[], ProbeResult]
    factory: Callable[[ModelConfig], Engine]
    auto_priority: int | None = 10
    description: str = ""
    prepare: Callable[[ModelConfig], None] | None = None
    worker_defaults: Callable[[ModelConfig], Mapping[str, Any]] | None = None
    check_options: Callable[[ModelConfig], None] | None = None

    def prepare_step(self) -> Callable[[ModelConfig], None] | None:
        """What builds a model before its worker starts: :attr:`prepare`, else the
        factory's ``prepare`` method, else None (nothing to build)."""
        return self.prepare or getattr(self.factory, "prepare", None)

    def worker_settings(self, model: ModelConfig) -> WorkerSettings:
        """``model.worker`` with the engine's :attr:`worker_defaults` for the keys the
        config did not set (a key the config sets always wins).

        Raises:
            ConfigError: the merged settings are invalid (names ``models.<name>.worker``).
        """
        from pydantic import ValidationError

        defaults_of = self.worker_defaults or getattr(self.factory, "worker_defaults", None)
        defaults = dict(defaults_of(model)) if defaults_of is not None else {}
        settings = model.worker
        unset = {k: v for k, v in defaults.items() if k not in settings.model_fields_set}
        if not unset:
            return settings
        try:
            return type(settings).model_validate(
                {**unset, **settings.model_dump(exclude_unset=True)}
            )
        except ValidationError as exc:
            key = f"models.{model.name}.worker"
            msg = f"with the {self.name} engine's defaults {unset}: {exc.errors()[0]['msg']}"
            raise ConfigError(f"{key}: {msg}", [(key, msg)]) from None


class BackendRegistry:
    """Backends collected from every plugin, by name.

    Args:
        owner_of: ``(depth) -> plugin name`` of the code ``depth`` frames above the
            caller; the plugin host passes one so each spec records which plugin added it
            (shown by ``servehall plugins``). Without it owners are ``"?"``.
    """

    def __init__(self, owner_of: Callable[[int], str] | None = None) -> None:
        self._specs: dict[str, BackendSpec] = {}
        self.owners: dict[str, str] = {}
        self._owner_of = owner_of

    def add(self, spec: BackendSpec) -> None:
        """Register ``spec``. Raises ConfigError when the name is already taken."""
        owner = self._owner_of(1) if self._owner_of is not None else "?"
        if spec.name in self._specs:
            raise ConfigError(
                f"backend {spec.name!r} registered twice "
                f"(by {self.owners[spec.name]!r} and {owner!r})"
            )
        self._specs[spec.name] = spec
        self.owners[spec.name] = owner

    def get(self, name: str) -> BackendSpec:
        """The spec called ``name``; ConfigError listing known names otherwise."""
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise ConfigError(f"unknown backend {name!r}; registered backends: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[BackendSpec]:
        return [self._specs[n] for n in self.names()]

    def probe(self, name: str) -> ProbeResult:
        """Run a backend's probe, turning any exception into an unavailable result."""
        spec = self.get(name)
        try:
            return spec.probe()
        except Exception as exc:  # a probe must never break the host
            return ProbeResult(False, f"probe raised {type(exc).__name__}: {exc}")

    def select(self, name: str) -> BackendSpec:
        """Resolve a configured backend name (``"auto"`` included) to one spec.

        ``auto`` considers backends whose ``auto_priority`` is not None, in this order:

        1. accelerators (``auto_priority >= ACCELERATOR_PRIORITY``, e.g. cuda/rocm 300,
           ascend 200): exactly one available is chosen; several available is ambiguous;
        2. otherwise CPU backends by ``auto_priority`` (e.g. openvino_cpu above ``cpu`` 10);
           a tie at the top is ambiguous.

        Ambiguity, or no available backend, raises ConfigError listing every candidate
        with its probe reason. A named backend that is unavailable also raises ConfigError
        with its reason.
        """
        if name != "auto":
            spec = self.get(name)
            result = self.probe(name)
            if not result.available:
                raise ConfigError(f"backend {name!r} is not available: {result.reason}")
            return spec
        candidates: list[tuple[BackendSpec, ProbeResult]] = [
            (s, self.probe(s.name)) for s in self.specs() if s.auto_priority is not None
        ]
        report = "; ".join(
            f"{s.name}: {'available' if r.available else 'unavailable'} ({r.reason})"
            for s, r in candidates
        )
        usable = [s for s, r in candidates if r.available]
        if not usable:
            raise ConfigError(f"backend 'auto': no backend is available — {report or 'none'}")
        accelerators = [s for s in usable if (s.auto_priority or 0) >= ACCELERATOR_PRIORITY]
        if len(accelerators) > 1:
            names = ", ".join(s.name for s in accelerators)
            raise ConfigError(
                f"backend 'auto' is ambiguous: several accelerators are available ({names}); "
                f"name one in config — {report}"
            )
        if accelerators:
            return accelerators[0]
        top = max(s.auto_priority or 0 for s in usable)
        best = [s for s in usable if (s.auto_priority or 0) == top]
        if len(best) > 1:
            names = ", ".join(s.name for s in best)
            raise ConfigError(
                f"backend 'auto' is ambiguous: {names} are equally preferred; "
                f"name one in config — {report}"
            )
        return best[0]

    def describe(self) -> list[dict[str, Any]]:
        """``[{name, plugin, available, reason, auto_priority}]`` for ``servehall plugins``."""
        out = []
        for spec in self.specs():
            r = self.probe(spec.name)
            out.append(
                {
                    "name": spec.name,
                    "plugin": self.owners.get(spec.name),
                    "available": r.available,
                    "reason": r.reason,
                    "auto_priority": spec.auto_priority,
                }
            )
        return out
