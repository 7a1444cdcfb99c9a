"""The principal's typed policy: per-request priority and the per-tenant prompt-storage
choice reaching the record bus (P02). Model access is ``test_access.py``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from servehall import Policy
from servehall.records.bus import RecordBus
from servehall.records.types import RequestRecord


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
