"""The OpenAPI 3.1 document at ``/openapi.json``, generated from the pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from servehall.api import models as m
from servehall.version import __version__

_ERRORS = {
    "400": "Invalid request (validation, context length, content filter, unsupported parameter)",
    "401": "Missing or bad credential",
    "403": "Permission denied",
    "404": "Unknown model",
    "413": "Body too large",
    "415": "Content-Type is not application/json",
    "429": "Rate limited (Retry-After)",
    "503": "Overloaded or not ready (Retry-After)",
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


def _errors() -> dict[str, Any]:
    return {
        code: {"description": d, "content": _json(m.ErrorResponse)} for code, d in _ERRORS.items()
    }


def _inference(
    req: type[BaseModel], resp: type[BaseModel], chunk: type[BaseModel], summary: str
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(req)},
            "responses": {
                "200": {
                    "description": "The completion; with stream=true, server-sent events "
                    "(`data: <chunk>` … `data: [DONE]`).",
                    "content": {**_json(resp), "text/event-stream": {"schema": _ref(chunk)}},
                },
                **_errors(),
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    """The document (stable for a given servehall version)."""
    models: list[type[BaseModel]] = [
        m.ChatCompletionRequest,
        m.ChatCompletion,
        m.ChatCompletionChunk,
        m.CompletionRequest,
        m.Completion,
        m.ModelList,
        m.ErrorResponse,
    ]
    _, defs = models_json_schema(
        [(x, "validation" if x.__name__.endswith("Request") else "serialization") for x in models],
        ref_template="#/components/schemas/{model}",
    )
    health = {
        "get": {
            "summary": "",
            "responses": {"200": {"description": "OK"}, "503": {"description": "Not ready"}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "servehall",
            "version": __version__,
            "description": "OpenAI-compatible inference API.",
        },
        "paths": {
            "/v1/chat/completions": _inference(
                m.ChatCompletionRequest,
                m.ChatCompletion,
                m.ChatCompletionChunk,
                "Create a chat completion",
            ),
            "/v1/completions": _inference(
                m.CompletionRequest, m.Completion, m.Completion, "Create a text completion"
            ),
            "/v1/models": {
                "get": {
                    "summary": "Models the caller may use",
                    "responses": {
                        "200": {"description": "Model list", "content": _json(m.ModelList)},
                        **{k: v for k, v in _errors().items() if k == "401"},
                    },
                }
            },
            "/health/live": {"get": {**health["get"], "summary": "The process answers"}},
            "/health/ready": {
                "get": {
                    **health["get"],
                    "summary": "A model is loaded and a probe inference succeeded recently",
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "text exposition"}},
                }
            },
        },
        "components": {"schemas": defs.get("$defs", {})},
    }
