"""The authenticator on a real SQLite key store: outcomes, audit events and throttling."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servehall import (
    AdmissionRequest,
    AuditEvent,
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
    Policy,
    Principal,
)
from servehall.admission.access import check_model_access
from servehall_auth.audit import FailureAuditor
from servehall_auth.runtime import AuthRuntime
from servehall_auth.settings import AuthSettings
from servehall_auth.store import KeyStore, api_key, make_engine, metadata

PEPPER = "authn-test-pepper-0123456789"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def runtime(tmp_path: Path) -> Any:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.create_all(c, tables=[api_key]))
    events: list[AuditEvent] = []
    settings = AuthSettings(pepper=PEPPER, audit_failures_per_minute=3)  # type: ignore[arg-type]
    rt = AuthRuntime(settings, KeyStore(engine, PEPPER), None, events.append)
    rt.events = events  # type: ignore[attr-defined]
    yield rt
    await rt.close()


async def test_good_key_gives_its_principal(runtime: AuthRuntime) -> None:
    assert runtime.keys is not None
    rec, key = await runtime.keys.create(tenant="t", models=["demo"], rpm=2)
    p = await runtime.authenticate([f"Bearer {key}"], [], path="/v1/models", client="1.2.3.4")
    assert p is not None and p.id == rec.public_id and p.tenant == "t"
    assert p.policy.hide_forbidden_models is False
    assert p.policy.models == frozenset({"demo"}) and p.policy.limits.rpm == 2
    assert await runtime.authenticate([], [], path="/", client=None) is None
    assert runtime.events == []  # type: ignore[attr-defined]


async def test_failures_raise_and_are_audited_without_secrets(runtime: AuthRuntime) -> None:
    assert runtime.keys is not None
    rec, key = await runtime.keys.create(tenant="t")
    wrong = key[:-2] + ("zz" if not key.endswith("zz") else "yy")
    for auth, xkey in (
        ([f"Bearer {wrong}"], []),
        (["Basic abc"], []),
        ([], ["sh-nope"]),
    ):
        with pytest.raises(AuthenticationError) as ei:
            await runtime.authenticate(auth, xkey, path="/v1/models", client="1.2.3.4")
        assert ei.value.headers["WWW-Authenticate"] == "Bearer"
    events = runtime.events  # type: ignore[attr-defined]
    assert [e.action for e in events] == ["auth.failed"] * 3
    assert events[0].target == rec.public_id and events[0].details["reason"] == "bad_secret"
    assert [e.details["reason"] for e in events[1:]] == ["malformed_header", "malformed_key"]
    assert all(wrong not in repr(e) and key not in repr(e) for e in events)


async def test_jwt_shaped_token_without_jwt_config(runtime: AuthRuntime) -> None:
    with pytest.raises(AuthenticationError):
        await runtime.authenticate(["Bearer a.b.c"], [], path="/", client=None)


def test_failure_auditor_throttles_and_summarises() -> None:
    clock = Clock()
    got: list[AuditEvent] = []
    aud = FailureAuditor(got.append, per_minute=3, clock=clock)
    for _ in range(10):
        aud.failure("bad_secret", target="sh-x")
    assert [e.action for e in got] == ["auth.failed"] * 3
    assert aud.suppressed == 7
    clock.t += 20  # one event's worth of budget comes back
    aud.failure("bad_secret")
    assert [e.action for e in got[3:]] == ["auth.failed.suppressed", "auth.failed"]
    assert got[3].details == {"count": 7}
    silent = FailureAuditor(got.append, per_minute=0, clock=clock)
    silent.failure("x")
    assert len(got) == 5


def req(p: Principal, model: str = "demo") -> AdmissionRequest:
    return AdmissionRequest("r", "/v1/chat/completions", model, p, 5, 5)


async def test_authorize_leaves_access_to_the_core(runtime: AuthRuntime) -> None:
    # scope and model allow-list are decided once, by servehall.admission.access (core); the
    # plugin's authorize hook only reserves quota
    p = Principal(id="b", policy=Policy(models=frozenset({"demo"})))
    assert await runtime.authorize(req(p)) is None  # no limits configured
    with pytest.raises(PermissionDeniedError) as ei:
        check_model_access(
            Principal(id="a", policy=Policy(scopes=frozenset({"admin"}))), "demo", served=True
        )
    assert ei.value.code == "insufficient_scope"
    p = replace(p, policy=replace(p.policy, hide_forbidden_models=False))
    with pytest.raises(PermissionDeniedError) as ei:
        check_model_access(p, "other", served=True)
    assert ei.value.code == "model_not_allowed"
    with pytest.raises(NotFoundError):
        check_model_access(
            replace(p, policy=replace(p.policy, hide_forbidden_models=True)), "other", served=True
        )


async def test_audit_sink_failure_is_contained(runtime: AuthRuntime) -> None:
    def broken(_: AuditEvent) -> None:
        raise RuntimeError("sink down")

    runtime._audit = broken
    with pytest.raises(AuthenticationError):
        await runtime.authenticate(["Bearer sh-bad"], [], path="/", client=None)


async def test_unreachable_key_store_is_503_not_401(runtime: AuthRuntime) -> None:
    from servehall import ServiceUnavailableError

    assert runtime.keys is not None
    _, key = await runtime.keys.create(tenant="t")
    async with runtime.keys.engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.drop_all(c, tables=[api_key]))
    with pytest.raises(ServiceUnavailableError) as ei:
        await runtime.authenticate([f"Bearer {key}"], [], path="/", client=None)
    assert ei.value.status == 503 and ei.value.headers["Retry-After"] == "1"


async def test_tenant_prompt_policy_reaches_the_principal(runtime: AuthRuntime) -> None:
    from servehall_auth.settings import TenantSettings

    assert runtime.keys is not None
    runtime.settings = runtime.settings.model_copy(
        update={
            "tenants": {"keep": TenantSettings(store_prompts=True)},
            "hide_forbidden_models": True,
        }
    )
    _, k1 = await runtime.keys.create(tenant="keep")
    _, k2 = await runtime.keys.create(tenant="other")
    p1 = await runtime.authenticate([], [k1], path="/", client=None)
    p2 = await runtime.authenticate([], [k2], path="/", client=None)
    assert p1 is not None and p1.policy.store_prompts is True
    assert p2 is not None and p2.policy.store_prompts is None
    assert p1.policy.hide_forbidden_models is True


async def test_tenant_priority_default_reaches_the_principal(runtime: AuthRuntime) -> None:
    from servehall_auth.settings import TenantSettings

    assert runtime.keys is not None
    runtime.settings = runtime.settings.model_copy(
        update={"tenants": {"gold": TenantSettings(priority=5, max_priority=8)}}
    )
    _, gold = await runtime.keys.create(tenant="gold")
    _, plain = await runtime.keys.create(tenant="plain")
    p1 = await runtime.authenticate([], [gold], path="/", client=None)
    p2 = await runtime.authenticate([], [plain], path="/", client=None)
    assert p1 is not None and p1.policy.priority == 5
    assert p1.policy.max_priority == 8
    assert p2 is not None and p2.policy.priority is None and p2.policy.level == 0
    assert p2.policy.max_priority is None


async def test_a_keys_own_priority_overrides_its_tenants_default(runtime: AuthRuntime) -> None:
    from servehall_auth.settings import TenantSettings

    assert runtime.keys is not None
    runtime.settings = runtime.settings.model_copy(
        update={"tenants": {"gold": TenantSettings(priority=5, max_priority=8)}}
    )
    rec, own = await runtime.keys.create(tenant="gold", priority=-2, max_priority=20)
    assert (rec.priority, rec.max_priority) == (-2, 20)
    _, half = await runtime.keys.create(tenant="gold", max_priority=6)
    _, zero = await runtime.keys.create(tenant="gold", priority=0)
    p_own = await runtime.authenticate([], [own], path="/", client=None)
    p_half = await runtime.authenticate([], [half], path="/", client=None)
    assert p_own is not None and (p_own.policy.priority, p_own.policy.max_priority) == (-2, 20)
    assert p_own.policy.request_priority(30) == 20  # clamped to the key's own ceiling
    # only the ceiling is the key's own: the priority is the tenant's default
    assert p_half is not None and (p_half.policy.priority, p_half.policy.max_priority) == (5, 6)
    # an explicit 0 is the key's own, not "unset": the tenant's default does not apply
    p_zero = await runtime.authenticate([], [zero], path="/", client=None)
    assert p_zero is not None and p_zero.policy.priority == 0
    assert p_zero.policy.request_priority(None) == 0
    listed = {r.key_id: r for r in await runtime.keys.list()}
    assert listed[rec.key_id].as_dict()["priority"] == -2
    with pytest.raises(ValueError, match="priority must be in"):
        await runtime.keys.create(tenant="gold", priority=1001)


async def test_a_principal_without_a_tenant_gets_no_tenant_defaults(
    runtime: AuthRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JWT need not name a tenant: its principal keeps its own policy (this merge
    raised UnboundLocalError, a 500, for a tenant-less principal)."""
    bare = Principal(id="jwt:svc", tenant=None, kind="jwt", policy=Policy(priority=3))

    async def authenticate(*_: Any, **__: Any) -> Principal:
        return bare

    monkeypatch.setattr(runtime.authenticator, "authenticate", authenticate)
    p = await runtime.authenticate(["Bearer a.b.c"], [], path="/", client=None)
    assert p is not None and p.tenant is None
    assert (p.policy.priority, p.policy.max_priority, p.policy.store_prompts) == (3, None, None)
