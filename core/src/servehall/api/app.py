"""The Starlette application factory."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, request_response
from starlette.types import ASGIApp, Receive, Scope, Send

from servehall.api import admin_config, routes
from servehall.api import batches as batch_routes
from servehall.api import files as file_routes
from servehall.api import responses as response_routes
from servehall.api import tokenize as tokenizer_routes
from servehall.api.access_log import AccessLogMiddleware
from servehall.api.auth import AuthMiddleware
from servehall.api.embeddings import EmbeddingsEndpoint
from servehall.api.errors import install_handlers
from servehall.api.inference import InferenceEndpoint
from servehall.api.state import ApiState
from servehall.api.tracing import Tracing, TracingMiddleware
from servehall.metrics import Metrics
from servehall.plugin.host import Host
from servehall.plugin.registries import RouteRegistry
from servehall.serving.probe import Readiness

Handler = Callable[[Request], Awaitable[Response]] | ASGIApp
"""A route's endpoint: a request handler (a function) or an ASGI app."""


class _MethodDispatch:
    """The ASGI app of one path served by a handler per method (a request handler or an
    ASGI app each; ``HEAD`` goes to ``GET``'s)."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.apps: dict[str, ASGIApp] = {
            method: request_response(h) if inspect.isfunction(h) else cast(ASGIApp, h)
            for method, h in handlers.items()
        }
        if "GET" in self.apps:
            self.apps.setdefault("HEAD", self.apps["GET"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.apps[scope["method"]](scope, receive, send)


def _by_method(path: str, **handlers: Handler) -> Route:
    """One :class:`Route` for ``path`` dispatching on the method: Starlette answers a
    method no route of a path takes with a 405 whose ``Allow`` names the methods of the
    first route that matched the path only, so two routes for one path would hide each
    other's methods."""
    return Route(path, _MethodDispatch(handlers), methods=list(handlers))


def create_app(
    host: Host,
    *,
    metrics: Metrics | None = None,
    readiness: Readiness | None = None,
    tracing: Tracing | None = None,
    live: object | None = None,
) -> Starlette:
    """Build the ASGI app for ``host``: core routes, plugin routes, auth, error envelope,
    and a server span per inference request when ``tracing`` is given.

    ``app.state.api`` holds the :class:`~servehall.api.state.ApiState`; ``live`` (a
    :class:`~servehall.rollout.live.LiveConfig`) enables ``/admin/config`` changes.
    """
    metrics = metrics or Metrics(lambda: host)
    metrics.start_series((s.name, s.version) for s in host.models.values())
    readiness = readiness or Readiness(host)
    core: list[BaseRoute] = [
        Route("/health/live", routes.health_live, methods=["GET"]),
        Route("/health/ready", routes.health_ready, methods=["GET"]),
        Route("/v1/models", routes.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", routes.retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", InferenceEndpoint("chat"), methods=["POST"]),
        Route("/v1/completions", InferenceEndpoint("completion"), methods=["POST"]),
        Route("/v1/embeddings", EmbeddingsEndpoint(), methods=["POST"]),
        Route("/v1/responses", response_routes.ResponsesEndpoint(), methods=["POST"]),
        Route(
            "/v1/responses/{response_id}",
            response_routes.stored_response,
            methods=["GET", "DELETE"],
        ),
        Route(
            "/tokenize",
            tokenizer_routes.TokenizerEndpoint(tokenizer_routes.tokenize),
            methods=["POST"],
        ),
        Route(
            "/detokenize",
            tokenizer_routes.TokenizerEndpoint(tokenizer_routes.detokenize),
            methods=["POST"],
        ),
        _by_method("/v1/files", POST=file_routes.UploadEndpoint(), GET=file_routes.list_files),
        _by_method(
            "/v1/files/{file_id}", GET=file_routes.retrieve_file, DELETE=file_routes.delete_file
        ),
        Route("/v1/files/{file_id}/content", file_routes.file_content, methods=["GET"]),
        _by_method("/v1/batches", POST=batch_routes.create_batch, GET=batch_routes.list_batches),
        Route("/v1/batches/{batch_id}", batch_routes.retrieve_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batch_routes.cancel_batch, methods=["POST"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/openapi.json", routes.openapi, methods=["GET"]),
        _by_method("/admin/config", GET=admin_config.get_config, POST=admin_config.post_config),
    ]
    registry = RouteRegistry()
    host.plugins.routes(host, registry)
    middleware = [Middleware(AuthMiddleware)]
    if tracing is not None:
        middleware.insert(0, Middleware(TracingMiddleware, tracing=tracing))
    if host.settings.server.access_log:
        middleware.insert(0, Middleware(AccessLogMiddleware))  # outermost: 401s too
    app = Starlette(routes=[*core, *registry.routes], middleware=middleware)
    app.state.api = ApiState(
        host=host, metrics=metrics, readiness=readiness, tracing=tracing, live=live
    )
    install_handlers(app)
    return app
