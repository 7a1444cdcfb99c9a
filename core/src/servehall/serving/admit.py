"""Admission of one prepared request (steps 3 and 6 of the request path): authorize
(the plugins' quota reservations), the record bus's admission check, then a scheduler
slot — and, when the work is done, the slot released and the reservations settled.

Used by every endpoint that runs a model (chat, completions, responses, embeddings);
:func:`admit` marks the request's :class:`~servehall.serving.request.RequestState`
admitted (``admitted``, ``admitted_at``, the record's ``queue_time_s``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from servehall.admission.demand import OnlineDemand
from servehall.admission.scheduler import Slot, Ticket
from servehall.admission.usage import AdmissionRequest, Reservation
from servehall.plugin.host import ServedModel
from servehall.serving.choice import ChoiceStream
from servehall.serving.request import RequestState

log = logging.getLogger("servehall.api")


@dataclass(slots=True)
class Admitted:
    """An admitted request's scheduler ``slot``, quota ``reservations``, the
    ``headers`` its response carries (the caller's, then every reservation's rate-limit
    headers) and, for an online request, the replica's ``demand`` it counts in."""

    slot: Slot
    reservations: list[Reservation]
    headers: dict[str, str] = field(default_factory=dict)
    demand: OnlineDemand | None = None

    def add_headers(self, headers: dict[str, str]) -> None:
        """Set :attr:`headers`: ``headers`` and every reservation's response headers (a
        reservation whose headers fail is logged and skipped)."""
        self.headers = dict(headers)
        for r in self.reservations:
            try:
                self.headers.update(r.headers())
            except Exception:
                log.exception("a reservation's headers failed")

    def follow(self, choices: Sequence[ChoiceStream]) -> None:
        """Let a scheduler that reads generated tokens when it decides (a slot with
        ``track``) count those of ``choices``."""
        track = getattr(self.slot, "track", None)
        if track is not None:
            track(lambda: sum(c.completion_tokens for c in choices))

    async def done(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Release the slot and settle every reservation with the tokens used (a failing
        one is logged, never raised); an online request leaves the demand count."""
        self.slot.release()
        demand, self.demand = self.demand, None
        if demand is not None:
            demand.end()
        for r in self.reservations:
            try:
                await r.settle(prompt_tokens, completion_tokens)
            except Exception:
                log.exception("settling a reservation failed")


async def admit(
    state: RequestState, served: ServedModel, admission: AdmissionRequest, priority: int
) -> Admitted:
    """Authorize ``admission`` (quota reservations), check that the record bus admits
    requests, then wait for a slot of ``served``'s scheduler at ``priority``; the
    reservations are released when any of it fails (the error propagates: 429 from a
    quota, 503 ``records_unavailable``, ``queue_full`` or ``queue_timeout``).

    An online request (not a batch line) counts in the replica's
    :class:`~servehall.admission.demand.OnlineDemand` from before it queues until
    :meth:`Admitted.done`, so a running batch yields to it."""
    host = state.host
    reservations: list[Reservation] = await host.plugins.authorize(host, admission)
    demand = host.online if state.batch_priority is None else None
    if demand is not None:
        demand.begin()
    try:
        if host.records is not None:
            host.records.check_admission()
        slot = await served.scheduler.acquire(
            Ticket(
                request_id=state.request_id,
                model=served.name,
                tenant=state.principal.tenant,
                principal_id=state.principal.id,
                priority=priority,
                cost_tokens=admission.token_estimate,
                prompt_tokens=admission.prompt_tokens,
            )
        )
    except BaseException:
        if demand is not None:
            demand.end()
        for r in reservations:
            with contextlib.suppress(Exception):
                await r.release()
        raise
    state.admitted = True
    state.admitted_at = time.monotonic()
    state.record.queue_time_s = slot.queue_time_s
    return Admitted(slot, reservations, demand=demand)
