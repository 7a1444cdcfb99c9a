"""``servehall.rollout.choose``: what makes a caller sticky to a version, and who may pin
one with the version header."""

from __future__ import annotations

from typing import Any

import pytest

from servehall.admission.principal import (
    ANONYMOUS,
    SCOPE_ADMIN,
    SCOPE_INFERENCE,
    SCOPE_MODEL_VERSION,
    Policy,
    Principal,
)
from servehall.errors import PermissionDeniedError
from servehall.rollout.choose import choose_version, may_pin, sticky_key


def _key(*scopes: str) -> Principal:
    return Principal(id="sh-k1", policy=Policy(scopes=frozenset(scopes)))


def test_a_key_is_sticky_by_its_id_and_user() -> None:
    assert sticky_key(_key(SCOPE_INFERENCE), None) == "sh-k1"
    assert sticky_key(_key(SCOPE_INFERENCE), "") == "sh-k1"
    assert sticky_key(_key(SCOPE_INFERENCE), "alice") == "sh-k1\x00alice"


def test_an_anonymous_caller_is_sticky_only_by_user() -> None:
    anon = Principal(id="anonymous", kind="anonymous")
    assert sticky_key(anon, None) is None
    assert sticky_key(anon, "alice") == "user:alice"


def test_who_may_pin() -> None:
    assert may_pin(_key(SCOPE_MODEL_VERSION))
    assert may_pin(_key(SCOPE_ADMIN))
    assert not may_pin(_key(SCOPE_INFERENCE))
    assert may_pin(ANONYMOUS)  # no auth plugin: the anonymous caller is an admin


def test_a_pin_without_the_scope_is_a_403_before_any_routing() -> None:
    api: Any = object()  # never read: the refusal comes first
    with pytest.raises(PermissionDeniedError) as err:
        choose_version(api, "m", _key(SCOPE_INFERENCE), None, "v2")
    assert err.value.code == "insufficient_scope"
    assert SCOPE_MODEL_VERSION in str(err.value)
