"""Audit events of the auth plugin, and the throttle that keeps a flood of failed
logins from filling the ``audit_event`` table.

Actions: ``key.created``, ``key.revoked``, ``key.rotated``, ``key.listed``,
``key.viewed`` (admin API and CLI), ``auth.failed`` (a bad credential: reason, key id
when the key parsed, path, client address — never the credential) and
``auth.failed.suppressed`` (how many ``auth.failed`` events the throttle dropped since
the last one it let through).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from servehall import AuditEvent

log = logging.getLogger("servehall_auth")

AuditFn = Callable[[AuditEvent], None]
"""Where events go: ``host.records.audit`` on the server."""


class FailureAuditor:
    """Emits ``auth.failed`` events, at most ``per_minute`` per process (token bucket).

    Args:
        emit: the audit sink (must not block or raise).
        per_minute: budget; 0 disables failure events (they are still logged at INFO).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self, emit: AuditFn, per_minute: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._emit = emit
        self._cap = float(per_minute)
        self._level = float(per_minute)
        self._clock = clock
        self._at = clock()
        self.suppressed = 0

    def failure(self, reason: str, target: str | None = None, **details: Any) -> None:
        """Record one failed authentication.

        ``target`` is the public key id (``sh-…``) or JWT subject when known;
        ``details`` must hold no secret."""
        now = self._clock()
        self._level = min(self._cap, self._level + (now - self._at) * self._cap / 60.0)
        self._at = now
        if self._level < 1:
            # a flood must not fill the log either: the suppressed ones go to DEBUG
            log.debug("authentication failed: reason=%s key=%s %s", reason, target, details)
            self.suppressed += 1
            return
        log.info("authentication failed: reason=%s key=%s %s", reason, target, details)
        self._level -= 1
        if self.suppressed:
            self._emit(
                AuditEvent(action="auth.failed.suppressed", details={"count": self.suppressed})
            )
            self.suppressed = 0
        self._emit(
            AuditEvent(action="auth.failed", target=target, details={"reason": reason, **details})
        )
