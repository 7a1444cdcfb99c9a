"""End-to-end tests of the auth plugin against a real ``servehall serve`` (Hypercorn,
HTTP/2 via httpx, the demo model) with keys in a real SQLite file and a real PostgreSQL
database: cases C14 (per-key limit), C16 (header forms), C17 (secrets nowhere), the
route-table test, JWT, admin API, key rotation with overlap, revocation, audit events.

Keys are made with the real CLI (``servehall keys create``) in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sqlalchemy.ext.asyncio import create_async_engine

from servehall.db.testing import pg_execute
from tests.conftest import ServerHandle, demo_config, dump_toml, run_cli

PEPPER = "e2e-pepper-" + uuid.uuid4().hex
PEPPER_ENV = "SERVEHALL_E2E_AUTH_PEPPER"
ISS = "https://idp.e2e.test"
AUD = "servehall-e2e"
PG_DEFAULT = "postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/servehall_test"


# --- helpers ---------------------------------------------------------------------------


def cli(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real ``servehall`` CLI with the test's pepper in the environment."""
    proc = run_cli(config, *args, env={PEPPER_ENV: PEPPER}, cwd=config.parent)
    if check and proc.returncode != 0:
        raise AssertionError(f"servehall {' '.join(args)} failed: {proc.stdout}\n{proc.stderr}")
    return proc


def create_key(config: Path, tenant: str, *extra: str) -> dict[str, Any]:
    out = cli(config, "keys", "create", "--tenant", tenant, "--json", *extra)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def chat(model: str = "demo", max_tokens: int = 1) -> dict[str, Any]:
    return {
        "model": model,
        "temperature": 0,
        "seed": 1,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Hi"}],
    }


def assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    body = r.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    assert body["error"]["type"] == "authentication_error"
    assert "Traceback" not in r.text


async def _dump_tables(url: str) -> str:
    """Every row of every table in the database, as text."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            out = []
            for name in names:
                rows = (await conn.execute(sa.text(f'SELECT * FROM "{name}"'))).all()
                out.append(f"{name}: {[tuple(r) for r in rows]!r}")
            return "\n".join(out)
    finally:
        await engine.dispose()


async def _query(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            res = await conn.execute(sa.text(sql), params)
            return [dict(m) for m in res.mappings().all()]
    finally:
        await engine.dispose()


def query(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    return asyncio.run(_query(url, sql, **params))


def wait_for_rows(url: str, sql: str, n: int, timeout: float = 15.0, **params: Any) -> list[Any]:
    """Poll until ``sql`` returns at least ``n`` rows (the sql sink batches writes)."""
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = query(url, sql, **params)
        if len(rows) >= n:
            return rows
        time.sleep(0.25)
    return rows


# --- the deployment ----------------------------------------------------------------------


class Deployment:
    """A running server plus what the tests need to reach it."""

    def __init__(
        self,
        server: ServerHandle,
        config: Path,
        db_url: str,
        keys: dict[str, dict[str, Any]],
        rsa_key: Any,
        ec_key: Any,
    ) -> None:
        self.server = server
        self.config = config
        self.db_url = db_url
        self.keys = keys
        self.rsa_key = rsa_key
        self.ec_key = ec_key
        self.url = server.base_url
        self.hide_models = False

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, http1=False, http2=True, timeout=60.0, **kw)

    def key(self, name: str) -> str:
        return str(self.keys[name]["key"])

    def jwt(self, key: Any, alg: str, kid: str, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISS, "aud": AUD, "sub": "svc-1", "iat": now, "exp": now + 300}
        body.update({"tenant": "team-jwt", "scope": "inference"})
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key, alg, headers={"kid": kid})


def _jwks(rsa_key: Any, ec_key: Any) -> dict[str, Any]:
    algs = jwt.algorithms.get_default_algorithms()
    r = json.loads(algs["RS256"].to_jwk(rsa_key.public_key()))
    e = json.loads(algs["ES256"].to_jwk(ec_key.public_key()))
    r["kid"], e["kid"] = "rsa-1", "ec-1"
    return {"keys": [r, e]}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def deployment(
    request: pytest.FixtureRequest,
    servehall_server: Any,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp(f"auth-{request.param}")
    pg_base = os.environ.get("SERVEHALL_TEST_PG_URL", PG_DEFAULT)
    pg_name = f"servehall_auth_e2e_{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        db_url = f"sqlite+aiosqlite:///{work / 'servehall.db'}"
    else:
        try:
            asyncio.run(pg_execute(pg_base, f'CREATE DATABASE "{pg_name}"', timeout=5))
        except Exception as exc:
            pytest.skip(f"PostgreSQL not available ({type(exc).__name__}); run .ci/services.sh")
        from sqlalchemy.engine import make_url

        db_url = make_url(pg_base).set(database=pg_name).render_as_string(hide_password=False)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = work / "jwks.json"
    jwks.write_text(json.dumps(_jwks(rsa_key, ec_key)))
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["auth"]},
        server={"log_level": "debug"},
        database={"url": db_url},
        sinks=[{"name": "sql", "options": {"linger_s": 0.05}}],
        auth={
            "pepper": {"env": PEPPER_ENV},
            "key_cache_ttl_s": 0,
            "audit_failures_per_minute": 5,
            "hide_forbidden_models": request.param == "postgresql",
            # P02: this tenant keeps prompts although [database] store_prompts is off
            "tenants": {"keep": {"store_prompts": True}},
            "jwt": {
                "issuer": ISS,
                "audience": AUD,
                "algorithms": ["RS256", "ES256"],
                "jwks_file": str(jwks),
                "leeway_s": 5,
            },
        },
    )
    config = work / "deploy.toml"
    config.write_text(dump_toml(cfg))
    cli(config, "db", "upgrade")
    keys = {
        "user": create_key(config, "team-a", "--name", "user", "--models", "demo"),
        "admin": create_key(config, "ops", "--name", "admin", "--scopes", "inference,admin"),
        "limited": create_key(config, "team-b", "--rpm", "6"),
        "tokens": create_key(config, "team-t", "--tpm", "600"),
        "other_model": create_key(config, "team-c", "--models", "other-model"),
        "no_inference": create_key(config, "team-c", "--scopes", "admin"),
        "canary": create_key(config, "team-canary"),
        "keep": create_key(config, "keep"),
    }
    server = servehall_server(
        config.read_text(), env={PEPPER_ENV: PEPPER}, name=f"auth-{request.param}"
    )
    try:
        d = Deployment(server, config, db_url, keys, rsa_key, ec_key)
        d.hide_models = request.param == "postgresql"
        yield d
    finally:
        server.stop()
        if request.param == "postgresql":
            asyncio.run(
                pg_execute(pg_base, f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)', timeout=5)
            )


# --- C16: header forms ---------------------------------------------------------------------


def test_c16_documented_forms_accepted(deployment: Deployment) -> None:
    k = deployment.key("user")
    with deployment.client() as c:
        for headers in (
            {"Authorization": f"Bearer {k}"},
            {"authorization": f"bearer {k}"},
            {"Authorization": f"BEARER {k}"},
            {"x-api-key": k},
        ):
            r = c.post("/v1/chat/completions", json=chat(), headers=headers)
            assert r.status_code == 200, (headers.keys(), r.text)
            assert r.http_version == "HTTP/2"
        r = c.get("/v1/models", headers={"x-api-key": k})
        assert [m["id"] for m in r.json()["data"]] == ["demo"]


def test_c16_malformed_forms_are_401(deployment: Deployment) -> None:
    k = deployment.key("user")
    bad_forms: list[dict[str, str]] = [
        {},
        {"Authorization": f"Bearer  {k}"},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": f"Basic {k}"},
        {"Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.bm90LWpzb24.c2ln"},  # malformed JWT
        {"Authorization": "Bearer a.b.c"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": f"Bearer {k[:-1]}"},
        {"Authorization": f"Bearer {k}x"},
        {"x-api-key": ""},
        {"x-api-key": "sh-"},
        {"Authorization": "Basic abc", "x-api-key": k},  # Authorization wins, and is bad
    ]
    with deployment.client() as c:
        for headers in bad_forms:
            for method, path, body in (
                ("POST", "/v1/chat/completions", chat()),
                ("GET", "/v1/models", None),
            ):
                r = c.request(method, path, json=body, headers=headers)
                assert_401(r)
                assert k not in r.text
        # the server is fine afterwards
        assert c.get("/health/live").status_code == 200
        r = c.post("/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {k}"})
        assert r.status_code == 200


# --- scopes and models -----------------------------------------------------------------------


def test_p02_tenant_store_prompts_reaches_request_log(deployment: Deployment) -> None:
    """[database] store_prompts = false, [auth.tenants.keep] store_prompts = true: the keep
    tenant's row has prompt and completion text, another tenant's has neither."""
    ids = {}
    with deployment.client() as c:
        for name in ("keep", "user"):
            body = {**chat(max_tokens=3), "messages": [{"role": "user", "content": "P02 " + name}]}
            r = c.post("/v1/chat/completions", json=body, headers=_bearer(deployment, name))
            assert r.status_code == 200, r.text
            ids[name] = r.json()["id"]
    sql = "SELECT request_id, tenant, prompt_text, completion_text FROM request_log"
    sql += " WHERE request_id IN (:a, :b)"
    rows = wait_for_rows(deployment.db_url, sql, 2, a=ids["keep"], b=ids["user"])
    by_id = {r["request_id"]: r for r in rows}
    keep, other = by_id[ids["keep"]], by_id[ids["user"]]
    assert keep["tenant"] == "keep" and "P02 keep" in (keep["prompt_text"] or "")
    assert keep["completion_text"] is not None
    assert other["tenant"] == "team-a"
    assert other["prompt_text"] is None and other["completion_text"] is None


def _bearer(deployment: Deployment, name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {deployment.key(name)}"}


def test_models_outside_the_list(deployment: Deployment) -> None:
    # SQLite deployment: hide_forbidden_models = false (403); PostgreSQL: true (404)
    with deployment.client(headers={"x-api-key": deployment.key("other_model")}) as c:
        assert c.get("/v1/models").json()["data"] == []
        r = c.post("/v1/chat/completions", json=chat())
        err = r.json()["error"]
        assert err["param"] == "model"
        if deployment.hide_models:
            assert (r.status_code, err["code"]) == (404, "model_not_found"), r.text
            unknown = c.post("/v1/chat/completions", json=chat(model="no-such-model"))
            # the same answer as for a model that does not exist: only the echoed name differs
            assert unknown.status_code == 404
            hidden = unknown.json()["error"]
            assert hidden["message"].replace("`no-such-model`", "`demo`") == err["message"]
            assert {**hidden, "message": ""} == {**err, "message": ""}
        else:
            assert (r.status_code, err["code"]) == (403, "model_not_allowed"), r.text
            assert err["type"] == "permission_error"


def test_inference_needs_the_inference_scope(deployment: Deployment) -> None:
    with deployment.client(headers={"x-api-key": deployment.key("no_inference")}) as c:
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "insufficient_scope"


# --- JWT -------------------------------------------------------------------------------------


def test_jwt_rs256_and_es256(deployment: Deployment) -> None:
    d = deployment
    with d.client() as c:
        for key, alg, kid in ((d.rsa_key, "RS256", "rsa-1"), (d.ec_key, "ES256", "ec-1")):
            token = d.jwt(key, alg, kid)
            r = c.post(
                "/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {token}"}
            )
            assert r.status_code == 200, r.text


def test_jwt_refused(deployment: Deployment) -> None:
    d = deployment
    now = int(time.time())
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = [
        d.jwt(d.rsa_key, "RS512", "rsa-1"),  # algorithm not pinned
        d.jwt(d.rsa_key, "RS256", "rsa-1", aud="someone-else"),
        d.jwt(d.rsa_key, "RS256", "rsa-1", iss="https://evil"),
        d.jwt(d.rsa_key, "RS256", "rsa-1", exp=now - 600, iat=now - 900),
        d.jwt(d.rsa_key, "RS256", "rsa-1", nbf=now + 600),
        d.jwt(other, "RS256", "rsa-1"),  # signed by a key the server does not trust
        jwt.encode({"iss": ISS, "aud": AUD, "sub": "x", "exp": now + 60, "iat": now}, None, "none"),
    ]
    with d.client() as c:
        for token in bad:
            r = c.post(
                "/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {token}"}
            )
            assert_401(r)
            assert token not in d.server.log_text()


# --- C14: per-key limit -----------------------------------------------------------------------


async def _burst(url: str, key: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, http1=False, http2=True, timeout=60.0) as c:
        return await asyncio.gather(
            *(
                c.post(
                    "/v1/completions",
                    json={"model": "demo", "prompt": "Hi", "max_tokens": 1},
                    headers={"x-api-key": key},
                )
                for _ in range(n)
            )
        )


def test_c14_per_key_limit(deployment: Deployment) -> None:
    # the "limited" key allows 6 requests per minute (one more every 10 s): send N + 1
    key = deployment.key("limited")
    rs = asyncio.run(_burst(deployment.url, key, 7))
    codes = sorted(r.status_code for r in rs)
    assert codes == [200] * 6 + [429], codes
    ok = [r for r in rs if r.status_code == 200]
    assert {r.headers["x-ratelimit-limit-requests"] for r in ok} == {"6"}
    assert sorted(r.headers["x-ratelimit-remaining-requests"] for r in ok) == list("012345")
    limited = next(r for r in rs if r.status_code == 429)
    body = limited.json()["error"]
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded"
    assert 1 <= int(limited.headers["retry-after"]) <= 10
    assert limited.headers["x-ratelimit-limit-requests"] == "6"
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    assert limited.headers["x-ratelimit-reset-requests"].endswith("s")
    # rejected requests consume nothing: ten more refusals leave the wait below 10 s
    # (had they been charged, the bucket would be 10 requests = 100 s in debt)
    rs = asyncio.run(_burst(deployment.url, key, 10))
    assert {r.status_code for r in rs} == {429}
    retry = max(int(r.headers["retry-after"]) for r in rs)
    assert retry <= 10
    time.sleep(retry + 0.3)
    rs = asyncio.run(_burst(deployment.url, key, 1))
    assert rs[0].status_code == 200, rs[0].text
    # every refusal is in the request log, and nothing was a 5xx
    rows = wait_for_rows(
        deployment.db_url,
        "SELECT status_code FROM request_log WHERE principal_id = :p",
        18,
        p=deployment.keys["limited"]["id"],
    )
    statuses = [r["status_code"] for r in rows]
    assert statuses.count(429) == 11 and statuses.count(200) == 7, statuses


def test_c14_tokens_reserved_then_settled(deployment: Deployment) -> None:
    """The "tokens" key allows 600 tokens per minute (10 per second refill).

    A request reserves prompt + max_tokens; when it stops early the unused part comes
    back, which the next request's x-ratelimit-remaining-tokens shows."""
    body: dict[str, Any] = {"model": "demo", "prompt": "Hi", "temperature": 0, "seed": 1}
    with deployment.client() as c:
        probe = c.post(
            "/v1/completions",
            json={**body, "max_tokens": 16},
            headers={"x-api-key": deployment.key("user")},
        )
        assert probe.status_code == 200
        text = probe.json()["choices"][0]["text"]
        prompt = probe.json()["usage"]["prompt_tokens"]
        if probe.json()["usage"]["completion_tokens"] == 16:
            # make the greedy continuation stop early: a stop string from its start
            i = next(
                i
                for i in range(1, len(text) - 1)
                if not text[i : i + 2].isspace()
                and " " not in text[i : i + 2]
                and text.find(text[i : i + 2]) == i
            )
            body["stop"] = [text[i : i + 2]]
        hdr = {"x-api-key": deployment.key("tokens")}
        r1 = c.post("/v1/completions", json={**body, "max_tokens": 100}, headers=hdr)
        assert r1.status_code == 200, r1.text
        used1 = r1.json()["usage"]["completion_tokens"]
        assert used1 <= 16
        assert int(r1.headers["x-ratelimit-remaining-tokens"]) == 600 - prompt - 100
        assert r1.headers["x-ratelimit-limit-tokens"] == "600"
        r2 = c.post("/v1/completions", json={**body, "max_tokens": 50}, headers=hdr)
        assert r2.status_code == 200, r2.text
        remaining = int(r2.headers["x-ratelimit-remaining-tokens"])
        settled = 600 - prompt - used1 - prompt - 50  # r1 charged its real usage only
        assert settled <= remaining <= settled + 40, (remaining, settled)  # + refill
        # an estimate above the whole limit can never fit
        r3 = c.post("/v1/completions", json={**body, "max_tokens": 600}, headers=hdr)
        assert r3.status_code == 429 and r3.json()["error"]["code"] == "tokens_exceed_limit"
        # C14: every per-key 429 carries Retry-After (the full window) and rate-limit headers
        assert r3.headers["retry-after"] == "60"
        assert r3.headers["x-ratelimit-limit-tokens"] == "600"
        assert int(r3.headers["x-ratelimit-remaining-tokens"]) <= 600
        assert "x-ratelimit-reset-tokens" in r3.headers


# --- admin API, rotation, revocation, audit ------------------------------------------------------


def test_admin_api_needs_admin_scope(deployment: Deployment) -> None:
    with deployment.client(headers={"x-api-key": deployment.key("user")}) as c:
        r = c.get("/admin/keys")
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
        assert c.post("/admin/keys", json={"tenant": "x"}).status_code == 403
    with deployment.client() as c:
        assert_401(c.get("/admin/keys"))


def test_admin_api_lifecycle_with_rotation_overlap(deployment: Deployment) -> None:
    admin = {"x-api-key": deployment.key("admin")}
    with deployment.client(headers=admin) as c:
        body = {"tenant": "team-z", "name": "svc", "models": ["demo"], "rpm": 100}
        r = c.post("/admin/keys", json={**body, "priority": 3, "max_priority": 5})
        assert r.status_code == 201, r.text
        made = r.json()
        assert (made["priority"], made["max_priority"]) == (3, 5)
        bad = c.post("/admin/keys", json={**body, "priority": 1001})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
        key, kid = made["key"], made["id"]
        assert key.startswith(kid + "-") and made["status"] == "active"
        listed = c.get("/admin/keys", params={"tenant": "team-z"}).json()["data"]
        assert [k["id"] for k in listed] == [kid] and "key" not in listed[0]
        one = c.get(f"/admin/keys/{kid}")
        assert (
            one.status_code == 200 and one.json()["tenant"] == "team-z" and "key" not in one.json()
        )
        assert c.post("/admin/keys", json={"tenant": ""}).status_code == 400
        assert (
            c.post(
                "/admin/keys", content=b"{", headers={"content-type": "application/json"}
            ).status_code
            == 400
        )

        def use(k: str) -> int:
            return c.post("/v1/chat/completions", json=chat(), headers={"x-api-key": k}).status_code

        assert use(key) == 200
        r = c.post(f"/admin/keys/{kid}/rotate", json={"overlap_s": 10})
        assert r.status_code == 200, r.text
        new = r.json()["key"]
        until = datetime.fromisoformat(r.json()["previous_secret_valid_until"])
        assert new != key and new.startswith(kid + "-")
        assert use(new) == 200 and use(key) == 200  # inside the overlap window
        assert datetime.now(UTC) < until  # (else the window was too short to test)
        time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds() + 0.3))
        assert use(key) == 401 and use(new) == 200
        r = c.post(f"/admin/keys/{kid}/revoke")
        assert r.status_code == 200 and r.json()["status"] == "revoked"
        assert use(new) == 401
        assert c.post("/admin/keys/sh-zzzzzzzzzz/revoke").status_code == 404
    actions = wait_for_rows(
        deployment.db_url,
        "SELECT action, actor, target, details FROM audit_event"
        " WHERE target = :t AND action LIKE 'key.%' ORDER BY id",
        4,
        t=kid,
    )
    got = [a["action"] for a in actions]
    assert got[:4] == ["key.created", "key.viewed", "key.rotated", "key.revoked"], got
    created = actions[0]["details"]
    created = json.loads(created) if isinstance(created, str) else created
    assert created["priority"] == 3 and created["max_priority"] == 5
    assert {a["actor"] for a in actions[:4]} == {deployment.keys["admin"]["id"]}
    text = repr(actions)
    assert key not in text and new not in text


def test_cli_rotate_and_revoke(deployment: Deployment) -> None:
    made = create_key(deployment.config, "team-cli")
    kid, key = made["id"], made["key"]
    with deployment.client() as c:

        def use(k: str) -> int:
            return c.post("/v1/chat/completions", json=chat(), headers={"x-api-key": k}).status_code

        assert use(key) == 200
        out = cli(deployment.config, "keys", "rotate", kid, "--overlap", "15s", "--json")
        rotated = json.loads(out.stdout)
        new = rotated["key"]
        until = datetime.fromisoformat(rotated["previous_secret_valid_until"])
        assert new != key
        assert use(new) == 200 and use(key) == 200  # both work inside the window
        assert datetime.now(UTC) < until
        time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds() + 0.3))
        assert use(key) == 401
        listing = cli(deployment.config, "keys", "list", "--tenant", "team-cli", "--json")
        rows = json.loads(listing.stdout)
        assert [r["id"] for r in rows] == [kid] and new not in listing.stdout
        cli(deployment.config, "keys", "revoke", kid)
        assert use(new) == 401
    rows = wait_for_rows(
        deployment.db_url,
        "SELECT action, actor FROM audit_event"
        " WHERE target = :t AND action LIKE 'key.%' ORDER BY id",
        3,
        t=kid,
    )
    assert [r["action"] for r in rows] == ["key.created", "key.rotated", "key.revoked"]
    assert all(r["actor"].startswith("cli:") for r in rows)


def test_auth_failures_are_audited_and_throttled(deployment: Deployment) -> None:
    before = query(
        deployment.db_url, "SELECT COUNT(*) AS n FROM audit_event WHERE action = 'auth.failed'"
    )[0]["n"]
    with deployment.client() as c:
        for i in range(40):
            assert_401(
                c.get("/v1/models", headers={"x-api-key": f"sh-aaaaaaaaa{i % 8 + 2}-" + "A" * 43})
            )
    time.sleep(1.0)
    rows = query(
        deployment.db_url,
        "SELECT action, target, details FROM audit_event WHERE action = 'auth.failed'",
    )
    # 5 per minute per process: the flood adds at most a handful of rows, not 40
    assert len(rows) - before <= 5
    assert rows and {"reason", "path", "client"} <= set(
        json.loads(rows[0]["details"])
        if isinstance(rows[0]["details"], str)
        else rows[0]["details"]
    )
    assert all("A" * 43 not in repr(r) for r in rows)


# --- C17: secrets nowhere ---------------------------------------------------------------------


def test_c17_canary_key_appears_nowhere(deployment: Deployment) -> None:
    d = deployment
    canary = d.key("canary")
    secret = canary.split("-", 2)[2]
    wrong = canary[:-4] + ("AAAA" if not canary.endswith("AAAA") else "BBBB")
    with d.client() as c:
        good = c.post(
            "/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {canary}"}
        )
        assert good.status_code == 200
        assert_401(
            c.post(
                "/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {wrong}"}
            )
        )
        bad_json = c.post(
            "/v1/chat/completions",
            content=b'{"model": "demo", "messages": [',
            headers={"Authorization": f"Bearer {canary}", "content-type": "application/json"},
        )
        assert bad_json.status_code == 400
        metrics = c.get("/metrics", headers={"x-api-key": d.key("admin")})
        assert metrics.status_code == 200
    wait_for_rows(
        d.db_url,
        "SELECT request_id FROM request_log WHERE principal_id = :p",
        2,
        p=d.keys["canary"]["id"],
    )
    shown = cli(d.config, "config", "show").stdout
    places = {
        "server log (debug)": d.server.log_text(),
        "database": asyncio.run(_dump_tables(d.db_url)),
        "metrics": metrics.text,
        "config show": shown,
        "responses": good.text + bad_json.text,
    }
    for where, text in places.items():
        for needle in (canary, wrong, secret, secret[:8], secret[-8:], PEPPER):
            assert needle not in text, f"a secret leaked into the {where}"
    # what is stored names the key by its public id only
    assert d.keys["canary"]["id"] in places["database"]
    assert "**********" in shown


# --- every route is guarded ------------------------------------------------------------------


def _route_table(config: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(method, path) of every route of the app built from ``config`` (auth enabled)."""
    from starlette.routing import Mount, Route

    from servehall import Host, load_deployment
    from servehall.api.app import create_app

    monkeypatch.setenv(PEPPER_ENV, PEPPER)
    settings, plugins = load_deployment(config)
    app = create_app(Host(settings=settings, plugins=plugins))
    out: list[tuple[str, str]] = []

    def walk(routes: list[Any], prefix: str) -> None:
        for r in routes:
            if isinstance(r, Mount):
                walk(list(r.routes), prefix + r.path)
            elif isinstance(r, Route):
                for m in sorted(r.methods or {"GET"}):
                    out.append((m, prefix + r.path))
            else:
                out.append(("GET", prefix + getattr(r, "path", "/")))

    walk(list(app.routes), "")
    return out


def test_every_route_needs_a_credential(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    table = _route_table(deployment.config, monkeypatch)
    paths = {p for _, p in table}
    assert {
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/models",
        "/admin/keys",
        "/admin/keys/{key_id}/rotate",
    } <= paths
    allowed = {"/health/live", "/health/ready"}
    checked = 0
    expected = len([1 for m, p in table if p not in allowed and m != "HEAD"]) + 2
    with deployment.client() as c:
        for method, path in [*table, ("GET", "/no/such/route"), ("POST", "/admin/nope")]:
            concrete = re.sub(r"\{[^}]+\}", "sh-aaaaaaaaaa", path)
            r = c.request(method, concrete, json={} if method in ("POST", "PUT", "PATCH") else None)
            if path in allowed:
                assert r.status_code != 401, (method, path)
                continue
            if method == "HEAD":
                assert r.status_code == 401, (method, path)
                continue
            assert_401(r)
            checked += 1
    assert checked == expected


def test_key_expiry(deployment: Deployment) -> None:
    # made through the admin API, not the CLI: a CLI process that starts slowly on a
    # loaded machine could use up a short expiry before the first request is sent
    admin = {"x-api-key": deployment.key("admin")}
    expires_at = datetime.now(UTC) + timedelta(seconds=5)
    with deployment.client(headers=admin) as c:
        r = c.post("/admin/keys", json={"tenant": "team-exp", "expires_at": expires_at.isoformat()})
        assert r.status_code == 201, r.text
    made = r.json()
    until = datetime.fromisoformat(made["expires_at"])
    assert abs((until - expires_at).total_seconds()) < 0.01
    with deployment.client(headers={"x-api-key": made["key"]}) as c:
        first = c.get("/v1/models")
        assert first.status_code == 200, (first.text, until, datetime.now(UTC))
        time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds() + 0.3))
        r = c.get("/v1/models")
        assert_401(r)
        assert "expired" in r.json()["error"]["message"]
