"""The name of this replica, stored in every ``request_log`` row (column ``replica``).

``[server] replica`` names it explicitly (e.g. the Kubernetes pod name through
``SERVEHALL_SERVER__REPLICA``); unset, it is ``<hostname>-<pid>``, which is unique among
replicas running at the same time (in Kubernetes the hostname is the pod name).
"""

from __future__ import annotations

import os
import socket


def default_replica_name() -> str:
    """``<hostname>-<pid>`` (hostname truncated so the whole fits 128 characters)."""
    return f"{socket.gethostname()[:100]}-{os.getpid()}"


def replica_name(configured: str | None) -> str:
    """``configured`` when set and not blank, else :func:`default_replica_name`."""
    if configured and configured.strip():
        return configured.strip()
    return default_replica_name()
