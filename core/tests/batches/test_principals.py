"""``servehall.batches.principals``: a principal stored with its batch as JSON comes back
the same, and its tenant group."""

from __future__ import annotations

import json

import pytest

from servehall.admission.principal import Limits, Policy, Principal
from servehall.batches.principals import principal_from_json, principal_to_json, tenant_of

_FULL = Principal(
    id="key_1",
    tenant="acme",
    kind="api_key",
    name="ci",
    policy=Policy(
        scopes=frozenset({"inference", "admin"}),
        models=frozenset({"b", "a"}),
        limits=Limits(rpm=60, tpm=1000),
        store_prompts=False,
        hide_forbidden_models=False,
        priority=5,
        max_priority=10,
    ),
)


@pytest.mark.parametrize(
    "principal",
    [_FULL, Principal(id="anon", tenant=None, kind="anonymous", name=None, policy=Policy())],
)
def test_round_trip_through_json_text(principal: Principal) -> None:
    stored = json.loads(json.dumps(principal_to_json(principal)))
    assert principal_from_json(stored) == principal


def test_sets_are_written_sorted_and_all_models_is_null() -> None:
    data = principal_to_json(_FULL)
    assert data["policy"]["scopes"] == ["admin", "inference"]
    assert data["policy"]["models"] == ["a", "b"]
    anyone = principal_to_json(Principal(id="p", policy=Policy(models=None)))
    assert anyone["policy"]["models"] is None


def test_missing_optional_fields_take_the_defaults() -> None:
    p = principal_from_json({"id": 7, "policy": {}})
    assert p.id == "7" and p.kind == "api_key" and p.tenant is None
    assert p.policy.scopes == frozenset() and p.policy.models is None
    assert p.policy.limits == Limits(rpm=None, tpm=None)
    assert p.policy.hide_forbidden_models is True


def test_another_shape_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        principal_from_json({"id": "x"})


def test_tenant_group_is_the_tenant_or_the_principal() -> None:
    assert tenant_of(_FULL) == "acme"
    assert tenant_of(Principal(id="k9", tenant=None)) == "principal:k9"
