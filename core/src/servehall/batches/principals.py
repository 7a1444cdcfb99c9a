"""A :class:`~servehall.admission.principal.Principal` as JSON: the identity and policy a
batch's lines run with, stored with the batch when it is created."""

from __future__ import annotations

from typing import Any

from servehall.admission.principal import Limits, Policy, Principal


def principal_to_json(p: Principal) -> dict[str, Any]:
    """``p`` as a JSON-able dict (the inverse of :func:`principal_from_json`)."""
    pol = p.policy
    return {
        "id": p.id,
        "tenant": p.tenant,
        "kind": p.kind,
        "name": p.name,
        "policy": {
            "scopes": sorted(pol.scopes),
            "models": None if pol.models is None else sorted(pol.models),
            "limits": {"rpm": pol.limits.rpm, "tpm": pol.limits.tpm},
            "store_prompts": pol.store_prompts,
            "hide_forbidden_models": pol.hide_forbidden_models,
            "priority": pol.priority,
            "max_priority": pol.max_priority,
        },
    }


def principal_from_json(data: dict[str, Any]) -> Principal:
    """The principal :func:`principal_to_json` wrote (KeyError/TypeError on another
    shape)."""
    pol = data["policy"]
    models = pol.get("models")
    limits = pol.get("limits") or {}
    return Principal(
        id=str(data["id"]),
        tenant=data.get("tenant"),
        kind=str(data.get("kind", "api_key")),
        name=data.get("name"),
        policy=Policy(
            scopes=frozenset(pol.get("scopes", ())),
            models=None if models is None else frozenset(models),
            limits=Limits(rpm=limits.get("rpm"), tpm=limits.get("tpm")),
            store_prompts=pol.get("store_prompts"),
            hide_forbidden_models=bool(pol.get("hide_forbidden_models", True)),
            priority=pol.get("priority"),
            max_priority=pol.get("max_priority"),
        ),
    )


def tenant_of(p: Principal) -> str:
    """The group a principal's batch lines are capped in (``[batches]
    max_lines_per_tenant``): its tenant, or its own id when it has none."""
    return p.tenant if p.tenant is not None else f"principal:{p.id}"
