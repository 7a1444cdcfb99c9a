"""Admission (:mod:`servehall.serving.admit`): reservations, the record bus's check and a
scheduler slot; what fails releases what was reserved; a reservation's failing headers
or settle is logged, never raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from servehall import hookimpl
from servehall.admission.principal import ANONYMOUS
from servehall.admission.usage import AdmissionRequest
from servehall.config.models import SchedulerSettings
from servehall.config.settings import Settings
from servehall.errors import ServehallError, ServiceUnavailableError
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.serving.admit import admit
from servehall.serving.request import RequestState


class Quota:
    """Reserves one reservation per request; its headers and settle fail on demand."""

    def __init__(self, broken: bool = False) -> None:
        self.events: list[str] = []
        self.broken = broken

    @hookimpl
    async def servehall_authorize(self, admission: Any) -> Any:
        quota = self

        class R:
            async def settle(self, p: int, c: int) -> None:
                if quota.broken:
                    raise RuntimeError("settle failed")
                quota.events.append(f"settle {p} {c}")

            async def release(self) -> None:
                quota.events.append("release")

            def headers(self) -> dict[str, str]:
                if quota.broken:
                    raise RuntimeError("headers failed")
                return {"x-ratelimit-remaining-tokens": "99"}

        self.events.append("reserve")
        return R()


class ClosedBus:
    def check_admission(self) -> None:
        raise ServiceUnavailableError("records unavailable", code="records_unavailable")


def _setup(quota: Quota, max_queue: int = 4) -> tuple[Host, ServedModel, RequestState]:
    host = Host(settings=Settings(), plugins=PluginHost([], extra=[("quota", quota)]))
    served = ServedModel(
        name="m",
        backend="scripted",
        engine=None,  # type: ignore[arg-type]
        scheduler=FcfsScheduler(SchedulerSettings(max_concurrency=1, max_queue=max_queue)),
        tokenizer=None,
        max_model_len=64,
    )
    state = RequestState(host, None, "cmpl-1", "/v1/completions", None)
    return host, served, state


def _admission() -> AdmissionRequest:
    return AdmissionRequest(
        request_id="cmpl-1",
        endpoint="/v1/completions",
        model="m",
        principal=ANONYMOUS,
        prompt_tokens=5,
        max_tokens=3,
    )


async def test_admitted_request_is_marked_and_settles() -> None:
    quota = Quota()
    _, served, state = _setup(quota)
    admitted = await admit(state, served, _admission(), 0)
    assert state.admitted and state.admitted_at is not None
    assert state.record.queue_time_s is not None
    admitted.add_headers({"x-request-id": "cmpl-1"})
    assert admitted.headers == {
        "x-request-id": "cmpl-1",
        "x-ratelimit-remaining-tokens": "99",
    }
    await admitted.done(5, 3)
    assert quota.events == ["reserve", "settle 5 3"]
    again = await admit(state, served, _admission(), 0)  # the slot was released
    await again.done(5, 0)


@pytest.mark.parametrize("where", ["records", "queue"])
async def test_a_refusal_releases_the_reservations(where: str) -> None:
    quota = Quota()
    host, served, state = _setup(quota, max_queue=0)
    if where == "records":
        host.records = ClosedBus()
    else:
        held = await admit(RequestState(host, None, "x", "/x", None), served, _admission(), 0)
    with pytest.raises(ServehallError) as raised:
        await admit(state, served, _admission(), 0)
    assert raised.value.status == 503
    assert not state.admitted
    assert quota.events[-1] == "release"
    if where == "queue":
        await held.done(0, 0)


async def test_failing_reservation_headers_and_settle_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quota = Quota(broken=True)
    _, served, state = _setup(quota)
    admitted = await admit(state, served, _admission(), 0)
    with caplog.at_level(logging.ERROR, logger="servehall.api"):
        admitted.add_headers({"x-request-id": "cmpl-1"})
        await admitted.done(5, 3)
    assert admitted.headers == {"x-request-id": "cmpl-1"}
    assert "a reservation's headers failed" in caplog.text
    assert "settling a reservation failed" in caplog.text
