"""The state of one request while it runs (:class:`RequestState`): who asked, its
choices, its prompt's text and token count, filter verdicts, and the one
:class:`~servehall.records.RequestRecord` and metrics it ends with.

It is the one per-request object of the request path: the API endpoints fill it, the
response writers read it, and :meth:`RequestState.finish` turns it into the record.
``finish`` is idempotent: the first call completes the record from the state (token
counts, the first token's time, verdicts), emits it through ``host.records.emit`` and
updates metrics; later calls do nothing. The request path calls it in a ``finally`` so
every outcome — success, validation error, auth failure, overload, client disconnect —
produces exactly one record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from servehall.admission.principal import ANONYMOUS, Principal
from servehall.metrics import ABORT_REASONS
from servehall.records.types import RequestRecord

if TYPE_CHECKING:
    from servehall.admission.filters import FilterVerdict
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host
    from servehall.serving.choice import ChoiceStream

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


class RequestState:
    """Facts gathered while one request runs (see the module docstring).

    ``created`` is the OpenAI ``created`` time (Unix seconds); ``choices`` holds one
    :class:`~servehall.serving.choice.ChoiceStream` per choice once the request is
    admitted (``n`` of them); ``prompt_tokens`` counts the rendered prompt's token ids;
    ``response_started`` turns true once the response's status line left.
    """

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
        self.request_id = request_id
        self.started = time.monotonic()
        self.created = int(time.time())
        self.record = RequestRecord(
            request_id=request_id,
            received_at=datetime.now(UTC),
            endpoint=endpoint,
            client_addr=client_addr,
            replica=host.replica,
        )
        self.principal: Principal = ANONYMOUS
        self.response_started = False
        self.choices: list[ChoiceStream] = []
        self.prompt_text = ""
        self.prompt_tokens = 0
        self.input_verdicts: list[FilterVerdict] = []
        self.verdicts: list[FilterVerdict] = []
        self.first_token_at: float | None = None
        self.admitted = False
        self._done = False

    def set_principal(self, principal: Principal | None) -> None:
        """Who asks (the record's principal, tenant and prompt-storage policy)."""
        if principal is not None:
            self.principal = principal
            self.record.principal_id = principal.id
            self.record.tenant = principal.tenant
            self.record.store_prompts = principal.policy.store_prompts

    def token(self, at: float) -> None:
        """Note a first token at monotonic time ``at`` (the earliest one counts)."""
        if self.first_token_at is None or at < self.first_token_at:
            self.first_token_at = at

    def completion_text(self) -> str | None:
        """The first choice's text so far (what the record stores), or None before
        admission."""
        return self.choices[0].text if self.choices else None

    def usage(self) -> dict[str, int]:
        """The OpenAI ``usage`` object: prompt, completion (all choices) and total tokens."""
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    async def record_before_last_byte(self) -> None:
        """With a sink that confirms writes (``[[sinks]] options.commit_wait_s``): finish
        the request's record (status 200) now and wait until it is written, so that the
        client receives the response's last bytes only once its request-log row is
        stored — a replica killed afterwards loses no record of a request its client saw
        complete. Without such a sink: nothing (the record is emitted after the response,
        as usual)."""
        bus = self.host.records
        if bus is None or not getattr(bus, "commit_wait", False):
            return
        self.finish(
            200,
            finish_reason=self.choices[0].finish_reason if self.choices else None,
            prompt_text=self.prompt_text,
            completion_text=self.completion_text(),
        )
        await bus.wait_written(self.record)

    def _gather(self) -> None:
        """Complete the record from the state: token counts, the first token's time
        (TTFT) and the filter verdicts."""
        rec = self.record
        rec.prompt_tokens = self.prompt_tokens
        if self.choices:
            rec.completion_tokens = sum(c.completion_tokens for c in self.choices)
            firsts = [c.first_token_at for c in self.choices if c.first_token_at is not None]
            if firsts:
                self.token(min(firsts))
        self.verdicts = [*self.input_verdicts, *(v for c in self.choices for v in c.verdicts)]

    def finish(
        self,
        status: int,
        *,
        error_code: str | None = None,
        finish_reason: str | None = None,
        prompt_text: str | None = None,
        completion_text: str | None = None,
    ) -> None:
        """Complete the record from the state, emit it and the metrics once
        (idempotent)."""
        if self._done:
            return
        self._done = True
        self._gather()
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
        model = rec.model if rec.model in self.host.models else ""
        endpoint = rec.endpoint if rec.endpoint in KNOWN_ENDPOINTS else "other"
        m.requests.labels(model, endpoint, str(rec.status_code)).inc()
        if not self.admitted:
            return
        m.e2e.labels(model).observe(now - self.started)
        if rec.queue_time_s is not None:
            m.queue.labels(model).observe(rec.queue_time_s)
        m.prompt_tokens.labels(model).inc(rec.prompt_tokens)
        m.generation_tokens.labels(model).inc(rec.completion_tokens)
        if rec.ttft_s is not None:
            m.ttft.labels(model).observe(rec.ttft_s)
            if rec.completion_tokens > 1 and self.first_token_at is not None:
                m.tpot.labels(model).observe(
                    (now - self.first_token_at) / (rec.completion_tokens - 1)
                )
        if rec.finish_reason in ABORT_REASONS:
            m.aborts.labels(model, rec.finish_reason).inc()
