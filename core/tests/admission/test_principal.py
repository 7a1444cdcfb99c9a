"""The principal's typed policy: model access decided in one place, per-request priority,
and the per-tenant prompt-storage choice reaching the record bus (P02)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from servehall import ANONYMOUS, NotFoundError, PermissionDeniedError, Policy, Principal
from servehall.admission.access import check_model_access
from servehall.records.bus import RecordBus
from servehall.records.types import RequestRecord


def _p(**policy: object) -> Principal:
    return Principal(id="k", policy=Policy(**policy))  # type: ignore[arg-type]


def test_model_access_in_one_place() -> None:
    check_model_access(ANONYMOUS, "m", served=True)
    check_model_access(_p(models=frozenset({"m"})), "m", served=True)
    with pytest.raises(NotFoundError) as nf:
        check_model_access(ANONYMOUS, "nope", served=False)
    assert nf.value.code == "model_not_found"
    hidden = _p(models=frozenset({"x"}))  # hide_forbidden_models defaults to True
    with pytest.raises(NotFoundError):
        check_model_access(hidden, "m", served=True)
    shown = _p(models=frozenset({"x"}), hide_forbidden_models=False)
    with pytest.raises(PermissionDeniedError) as pd:
        check_model_access(shown, "m", served=True)
    assert pd.value.code == "model_not_allowed"
    with pytest.raises(PermissionDeniedError) as sc:
        check_model_access(_p(scopes=frozenset({"admin"})), "m", served=True)
    assert sc.value.code == "insufficient_scope"


def test_request_priority_is_clamped_to_what_the_policy_allows() -> None:
    plain = Policy(priority=1)
    assert plain.request_priority(None) == 1
    assert plain.request_priority(9) == 1  # may not raise without max_priority
    assert plain.request_priority(-5) == -5  # lowering is always allowed
    boosted = Policy(priority=0, max_priority=5)
    assert boosted.request_priority(3) == 3 and boosted.request_priority(99) == 5
    unset = Policy()
    assert unset.priority is None and unset.request_priority(None) == 0
    assert unset.request_priority(4) == 0
    # a negative ceiling holds: a request cannot climb to 0 above it
    low = Policy(priority=-10, max_priority=-5)
    assert low.request_priority(0) == -5 and low.request_priority(-7) == -7
    assert low.request_priority(None) == -10


@pytest.mark.parametrize(
    ("global_on", "tenant", "kept"),
    [(False, True, True), (False, None, False), (True, False, False), (True, None, True)],
)
def test_tenant_store_prompts_overrides_the_global_setting(
    global_on: bool, tenant: bool | None, kept: bool
) -> None:
    bus = RecordBus([], store_prompts=global_on)
    rec = RequestRecord(
        request_id="r",
        received_at=datetime.now(UTC),
        prompt_text="p",
        completion_text="c",
        store_prompts=tenant,
    )
    bus.emit(rec)
    assert (rec.prompt_text, rec.completion_text) == (("p", "c") if kept else (None, None))
