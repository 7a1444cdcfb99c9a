"""Pick the version of a served model that serves one request.

Weighted choice over the versions that are ready, sticky per caller: the caller's key
(principal id, plus the request's optional ``user`` field) hashes to a point in [0, 1)
and the point falls into one version's share of the cumulative weights (versions in
configured order). The same caller lands on the same version while the weights stay
put, and a weight change moves only the callers whose point crosses a boundary — the
consistent split Gateway API ``HTTPRoute`` weights and KServe canaries lack per user.

A version that is not ready (its worker still loading or restarting, or drained by a
config change) gets no traffic: its weight goes to the ready ones, so a loading canary
never causes a 503 (KServe #5983). Only when no version is ready does the pick fall back
to every version (the request then queues or fails as it would with one version).

The header :data:`VERSION_HEADER` pins a version; the caller needs the
:data:`~servehall.admission.principal.SCOPE_MODEL_VERSION` scope (checked by the caller of
:meth:`VersionRouter.choose`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servehall.errors import InvalidRequestError

if TYPE_CHECKING:
    from servehall.plugin.host import Host, ServedModel

VERSION_HEADER = "x-servehall-model-version"
"""Request header pinning a version; the response header of the same name says which
version served."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One version as the pick sees it: its label, weight (>= 0) and readiness."""

    version: str
    weight: float
    ready: bool


def sticky_point(key: str) -> float:
    """A uniform point in [0, 1) from ``key`` (BLAKE2b, 64 bits); stable across
    processes and replicas (Python's ``hash`` is salted per process)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def pick_version(candidates: Sequence[Candidate], point: float) -> int:
    """The index of the candidate whose share of the cumulative weights holds ``point``.

    Args:
        candidates: the versions in configured order (non-empty).
        point: in [0, 1), e.g. :func:`sticky_point`.

    Only ready candidates with weight > 0 share the range; when there are none, ready
    candidates share it equally; when none is ready, every candidate does (weights, else
    equally).
    """
    pools: list[list[tuple[int, float]]] = [
        [(i, c.weight) for i, c in enumerate(candidates) if c.ready and c.weight > 0],
        [(i, 1.0) for i, c in enumerate(candidates) if c.ready],
        [(i, c.weight) for i, c in enumerate(candidates) if c.weight > 0],
        [(i, 1.0) for i in range(len(candidates))],
    ]
    pool = next(p for p in pools if p)
    total = sum(w for _, w in pool)
    target = point * total
    acc = 0.0
    for i, w in pool:
        acc += w
        if target < acc:
            return i
    return pool[-1][0]


def served_ready(served: ServedModel) -> bool:
    """Whether ``served`` may take new requests: its state is ``serving`` and, for an
    engine in a worker process, the worker is up; or it is ``unloaded`` (idle), which a
    request loads on demand."""
    if served.state == "unloaded":
        return True  # idle: the request loads it (servehall.rollout.idle)
    if served.state != "serving":
        return False
    return bool(getattr(served.engine, "worker_up", True))


class VersionRouter:
    """Chooses the :class:`~servehall.plugin.host.ServedModel` (version) for each request.

    Args:
        host: the running host; its ``models`` map keys (``name`` or ``name@version``)
            to versions, read on every call so live config changes apply at once.
        ready: readiness of one version (default :func:`served_ready`).
        rng: the source of points for callers without a sticky key.
    """

    def __init__(
        self,
        host: Host,
        ready: Callable[[ServedModel], bool] = served_ready,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.host = host
        self.ready = ready
        self.rng = rng

    def versions(self, name: str) -> list[ServedModel]:
        """The versions of ``name`` in configured order (empty: not served)."""
        return [s for s in self.host.models.values() if s.name == name and s.state != "removed"]

    def choose(self, name: str, sticky_key: str | None, pinned: str | None) -> ServedModel | None:
        """The version serving a request for ``name`` (None: no such model).

        Args:
            name: the requested model.
            sticky_key: the caller's key (None: a random point per request).
            pinned: the version label from :data:`VERSION_HEADER`, or None.

        Raises:
            InvalidRequestError: ``pinned`` names no version of ``name`` that takes
                requests (400 ``model_version_not_found``).
        """
        versions = self.versions(name)
        if not versions:
            return None
        if pinned is not None:
            for s in versions:
                if s.version == pinned and s.state in ("serving", "loading", "unloaded"):
                    return s
            known = ", ".join(s.version or '""' for s in versions if s.state == "serving")
            raise InvalidRequestError(
                f"Model `{name}` has no version {pinned!r} taking requests (versions: {known}).",
                param=VERSION_HEADER,
                code="model_version_not_found",
            )
        if len(versions) == 1:
            return versions[0]
        active = [s for s in versions if s.state != "draining"] or versions
        candidates = [Candidate(s.version, s.weight, self.ready(s)) for s in active]
        point = sticky_point(f"{name}\x00{sticky_key}") if sticky_key else self.rng()
        return active[pick_version(candidates, point)]
