"""``servehall.batches.call.BatchCall``: equality ignores the runner's ``preempted``
mark, and the scope key is the one the auth middleware and the inference path read."""

from __future__ import annotations

from servehall.admission.principal import Principal
from servehall.api import auth
from servehall.batches.call import SCOPE_KEY, BatchCall


def test_preempted_is_not_part_of_equality() -> None:
    owner = Principal(id="k1", tenant="t")
    a = BatchCall(owner, "batch_1", "line-1", priority=-5)
    b = BatchCall(owner, "batch_1", "line-1", priority=-5)
    assert not a.preempted
    b.preempted = True
    assert a == b
    assert a != BatchCall(owner, "batch_1", "line-2", priority=-5)
    assert a != BatchCall(owner, "batch_1", "line-1", priority=0)


def test_scope_key_is_shared_with_the_auth_middleware() -> None:
    assert SCOPE_KEY == "servehall.batch_call"
    assert auth.BATCH_CALL == SCOPE_KEY
    # Not a header-like name: a server never builds such a key from the network.
    assert "." in SCOPE_KEY and not SCOPE_KEY.startswith("http")
