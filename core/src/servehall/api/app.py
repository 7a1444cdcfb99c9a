"""The Starlette application factory."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route

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
        Route("/v1/files", file_routes.UploadEndpoint(), methods=["POST"]),
        Route("/v1/files", file_routes.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", file_routes.retrieve_file, methods=["GET"]),
        Route("/v1/files/{file_id}", file_routes.delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", file_routes.file_content, methods=["GET"]),
        Route("/v1/batches", batch_routes.create_batch, methods=["POST"]),
        Route("/v1/batches", batch_routes.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", batch_routes.retrieve_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batch_routes.cancel_batch, methods=["POST"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/openapi.json", routes.openapi, methods=["GET"]),
        Route("/admin/config", admin_config.get_config, methods=["GET"]),
        Route("/admin/config", admin_config.post_config, methods=["POST"]),
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
