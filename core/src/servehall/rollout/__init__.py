"""Versions of a served model: which version serves a request (:mod:`.router`).

A served name (what clients send as ``model``) maps to one or more versions, each a full
``[[models]]`` entry with a ``version`` label and a ``weight`` (docs/versions.md).
"""

from servehall.rollout.router import (
    VERSION_HEADER,
    Candidate,
    VersionRouter,
    pick_version,
    sticky_point,
)

__all__ = ["VERSION_HEADER", "Candidate", "VersionRouter", "pick_version", "sticky_point"]
