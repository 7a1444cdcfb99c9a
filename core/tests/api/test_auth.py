"""``servehall.api.auth.AuthMiddleware`` on the real app (httpx's ASGI transport): the
anonymous principal without authenticators, the allow-list, a plugin's 403/429 keeping
its status and headers, a plugin crash failing closed as 401, a batch call's principal
taken as is, and one request record per refusal whose id the response carries."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import Records

from servehall import hookimpl
from servehall.admission.principal import Principal
from servehall.api.app import create_app
from servehall.batches.call import SCOPE_KEY, BatchCall
from servehall.config.settings import Settings
from servehall.errors import AuthenticationError, PermissionDeniedError, RateLimitError
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost


class WhoAmI:
    """A plugin route answering the request's principal id."""

    @hookimpl
    def servehall_register_routes(self, router: Any) -> None:
        async def whoami(request: Any) -> JSONResponse:
            principal = getattr(request.state, "principal", None)
            return JSONResponse({"principal": principal.id if principal else None})

        router.add(Route("/x/whoami", whoami, methods=["GET", "POST"]))


class Auth:
    calls = 0

    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        Auth.calls += 1
        h = request.headers.get("authorization", "")
        if h == "Bearer good":
            return Principal(id="k1")
        if h == "Bearer banned":
            raise PermissionDeniedError("You may not.")
        if h == "Bearer busy":
            raise RateLimitError("Slow down.", headers={"Retry-After": "7"})
        if h == "Bearer bad":
            raise AuthenticationError()
        if h == "Bearer boom":
            raise ValueError("plugin bug")
        return None


def _host(*plugins: tuple[str, object], **server: Any) -> Host:
    settings = Settings(server=server) if server else Settings()
    host = Host(settings=settings, plugins=PluginHost([], extra=plugins))
    host.records = Records()  # type: ignore[assignment]
    return host


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_without_authenticators_everyone_is_anonymous() -> None:
    async with _client(create_app(_host(("who", WhoAmI())))) as c:
        r = await c.get("/x/whoami")
    assert r.status_code == 200 and r.json() == {"principal": "anonymous"}


async def test_principal_of_the_plugin_and_refusals() -> None:
    host = _host(("who", WhoAmI()), ("auth", Auth()))
    async with _client(create_app(host)) as c:
        ok = await c.get("/x/whoami", headers={"authorization": "Bearer good"})
        assert ok.json() == {"principal": "k1"}
        cases = [
            (None, 401, "authentication_error"),
            ("Bearer bad", 401, "authentication_error"),
            ("Bearer boom", 401, "authentication_error"),
            ("Bearer banned", 403, "permission_error"),
            ("Bearer busy", 429, "rate_limit_error"),
        ]
        ids = []
        for auth, status, kind in cases:
            headers = {"authorization": auth} if auth else {}
            r = await c.post("/x/whoami", headers=headers, content=b"x" * 1000)
            assert r.status_code == status, auth
            assert r.json()["error"]["type"] == kind
            if status == 401:
                assert r.headers["www-authenticate"] == "Bearer"
            if status == 429:
                assert r.headers["retry-after"] == "7"
            ids.append(r.headers["x-request-id"])
    records = host.records.records  # type: ignore[union-attr]
    refused = [rec for rec in records if rec.status_code >= 400]
    assert [rec.request_id for rec in refused] == ids
    assert [rec.status_code for rec in refused] == [401, 401, 401, 403, 429]
    # no authenticated principal: recorded as the anonymous one
    assert [(rec.principal_id, rec.endpoint) for rec in refused] == [("anonymous", "/x/whoami")] * 5


async def test_allow_paths_skip_authentication() -> None:
    host = _host(("who", WhoAmI()), ("auth", Auth()), auth_allow_paths=["/x/whoami"])
    Auth.calls = 0
    async with _client(create_app(host)) as c:
        r = await c.get("/x/whoami")
        assert r.status_code == 200 and r.json() == {"principal": None}
        assert (await c.get("/health/live")).status_code == 401  # not on this allow-list
    assert Auth.calls == 1


async def test_a_batch_call_runs_as_its_principal_without_authentication() -> None:
    host = _host(("who", WhoAmI()), ("auth", Auth()))
    app = create_app(host)
    call = BatchCall(Principal(id="owner-7"), "batch_1", "line-1", priority=0)
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/x/whoami",
        "raw_path": b"/x/whoami",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
        SCOPE_KEY: call,
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    Auth.calls = 0
    async with _client(app):  # runs the app's lifespan around the call
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert b'"owner-7"' in b"".join(m.get("body", b"") for m in sent)
    assert Auth.calls == 0
