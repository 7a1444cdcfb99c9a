"""Per-request bookkeeping: the one :class:`~servehall.records.RequestRecord` and metrics.

:meth:`RequestContext.finish` is idempotent: the first call builds the record, emits it
through ``host.records.emit`` and updates metrics; later calls do nothing. The request
path calls it in a ``finally`` so every outcome — success, validation error, auth
failure, overload, client disconnect — produces exactly one record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from servehall.metrics import ABORT_REASONS
from servehall.plugin.host import model_key
from servehall.records.types import RequestRecord
from servehall.rollout.guard import observe

if TYPE_CHECKING:
    from servehall.admission.filters import FilterVerdict
    from servehall.admission.principal import Principal
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host

log = logging.getLogger("servehall.request")

KNOWN_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})
"""Endpoint label values; any other path is counted as ``other``."""


def verdict_dict(v: FilterVerdict) -> dict[str, Any]:
    """A verdict as the request log stores it."""
    return {
        "rule": v.rule,
        "action": v.action,
        "stage": v.stage,
        "count": v.count,
        "monitor": v.monitor,
    }


class RequestContext:
    """Facts gathered while one request runs (see the module docstring)."""

    def __init__(
        self,
        host: Host,
        metrics: Metrics | None,
        request_id: str,
        endpoint: str,
        client_addr: str | None,
    ) -> None:
        self.host = host
        self.metrics = metrics
        self.started = time.monotonic()
        self.record = RequestRecord(
            request_id=request_id,
            received_at=datetime.now(UTC),
            endpoint=endpoint,
            client_addr=client_addr,
            replica=host.replica,
        )
        self.verdicts: list[FilterVerdict] = []
        self.first_token_at: float | None = None
        self.admitted = False
        self._done = False

    def set_principal(self, principal: Principal | None) -> None:
        if principal is not None:
            self.record.principal_id = principal.id
            self.record.tenant = principal.tenant
            self.record.store_prompts = principal.policy.store_prompts

    def token(self, at: float) -> None:
        """Note a first token at monotonic time ``at`` (the earliest one counts)."""
        if self.first_token_at is None or at < self.first_token_at:
            self.first_token_at = at

    def finish(
        self,
        status: int,
        *,
        error_code: str | None = None,
        finish_reason: str | None = None,
        prompt_text: str | None = None,
        completion_text: str | None = None,
    ) -> None:
        """Emit the record and metrics once (idempotent)."""
        if self._done:
            return
        self._done = True
        now = time.monotonic()
        rec = self.record
        rec.finished_at = datetime.now(UTC)
        rec.status_code = status
        if error_code is not None:
            rec.error_code = error_code
        if finish_reason is not None:
            rec.finish_reason = finish_reason
        rec.latency_s = now - self.started
        if self.first_token_at is not None:
            rec.ttft_s = self.first_token_at - self.started
        rec.filter_verdicts = [verdict_dict(v) for v in self.verdicts]
        keep = rec.store_prompts
        if keep is None:
            keep = self.host.settings.database.store_prompts
        if keep:
            rec.prompt_text = prompt_text
            rec.completion_text = completion_text
        records = self.host.records
        if records is not None:
            try:
                records.emit(dataclasses.replace(rec))
            except Exception:  # the bus must never break a response
                log.exception("record bus rejected a request record")
        self._observe(now)

    def _observe(self, now: float) -> None:
        m = self.metrics
        rec = self.record
        if m is None:
            return
        # only configured model names become label values (no unbounded cardinality)
        version = rec.version or ""
        served = self.host.models.get(model_key(rec.model, version)) if rec.model else None
        known = served is not None
        if served is not None and self.admitted:
            error = rec.status_code >= 500 or rec.finish_reason == "error"
            observe(self.host, m, served, error, rec.ttft_s)
        model = rec.model or "" if known else ""
        version = version if known else ""
        endpoint = rec.endpoint if rec.endpoint in KNOWN_ENDPOINTS else "other"
        m.requests.labels(model, version, endpoint, str(rec.status_code)).inc()
        if not self.admitted:
            return
        m.e2e.labels(model, version).observe(now - self.started)
        if rec.queue_time_s is not None:
            m.queue.labels(model, version).observe(rec.queue_time_s)
        m.prompt_tokens.labels(model, version).inc(rec.prompt_tokens)
        m.generation_tokens.labels(model, version).inc(rec.completion_tokens)
        if rec.ttft_s is not None:
            m.ttft.labels(model, version).observe(rec.ttft_s)
            if rec.completion_tokens > 1 and self.first_token_at is not None:
                m.tpot.labels(model, version).observe(
                    (now - self.first_token_at) / (rec.completion_tokens - 1)
                )
        if rec.finish_reason in ABORT_REASONS:
            m.aborts.labels(model, version, rec.finish_reason).inc()
