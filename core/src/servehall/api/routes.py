"""Small routes: health, model list, metrics and the OpenAPI document."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from servehall.admission.principal import ANONYMOUS, Principal
from servehall.api.openapi import openapi_document
from servehall.api.state import ApiState
from servehall.api.wire_replies import ModelCard
from servehall.errors import NotFoundError
from servehall.metrics import CONTENT_TYPE
from servehall.plugin.host import ServedModel

_STARTED = int(time.time())


def _api(request: Request) -> ApiState:
    api: ApiState = request.app.state.api
    return api


async def health_live(request: Request) -> Response:
    """200 while the process answers."""
    return JSONResponse({"status": "ok"})


async def health_ready(request: Request) -> Response:
    """200 when every model is loaded and its probe succeeded recently, else 503.

    The body reports per-model readiness and engine/scheduler counters (no identities).
    """
    ready, body = await _api(request).readiness.report()
    return JSONResponse(
        body, status_code=200 if ready else 503, headers=None if ready else {"Retry-After": "1"}
    )


def _principal(request: Request) -> Principal:
    principal: Principal | None = getattr(request.state, "principal", None)
    return principal or ANONYMOUS


def _card(name: str, served: ServedModel) -> dict[str, object]:
    """One model object of OpenAI's wire format (plus ``max_model_len``)."""
    return ModelCard(id=name, created=_STARTED, max_model_len=served.max_model_len).model_dump()


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: only the models the caller may use."""
    policy = _principal(request).policy
    router = _api(request).router
    data = [
        _card(name, router.versions(name)[0])
        for name in _api(request).host.served_names()
        if policy.may_use(name)
    ]
    return JSONResponse({"object": "list", "data": data})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model}``: that model's object (OpenAI's "retrieve model").

    Raises:
        NotFoundError: 404 ``model_not_found`` for a model this server does not serve
            and, alike, for one outside the caller's allow-list (the list hides it too).
    """
    name = request.path_params["model"]
    versions = _api(request).router.versions(name)
    if not versions or not _principal(request).policy.may_use(name):
        raise NotFoundError(
            f"The model `{name}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    return JSONResponse(_card(name, versions[0]))


async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(_api(request).metrics.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    """The OpenAPI document of this server (built once per app, see
    :func:`~servehall.api.openapi.openapi_document`)."""
    api = _api(request)
    doc = getattr(request.app.state, "openapi", None)
    if doc is None:
        from servehall.api.embeddings import model_task
        from servehall.api.sampling import OPTIONAL_SAMPLING_FIELDS

        host = api.host
        embedding = {s.name for s in host.models.values() if model_task(s) == "embed"}
        unsupported = {
            name
            for name in OPTIONAL_SAMPLING_FIELDS
            for served in host.models.values()
            if name not in served.engine.supported_params
        }
        doc = openapi_document(
            max_n=host.settings.server.max_n,
            unsupported=sorted(unsupported),
            bearer_auth=host.plugins.has_authenticators,
            public_paths=host.settings.server.auth_allow_paths,
            models=sorted(n for n in host.served_names() if n not in embedding),
            embedding_models=sorted(embedding),
            max_model_len=max((m.max_model_len for m in host.models.values()), default=None),
            max_token_id=min(
                (m.tokenizer.vocab_size - 1 for m in host.models.values()), default=None
            ),
        )
        request.app.state.openapi = doc
    return JSONResponse(doc)
