"""The OpenAPI 3.1 document at ``/openapi.json``, generated from the pydantic models
that validate requests, so that what the document allows the server accepts.

The document describes one server: :func:`openapi_document` takes what the request
models cannot know statically — ``[server] max_n`` (the route's bound on ``n``), the
served model names (``model`` is an ``enum``) and their largest context (the bound on
``max_tokens``), the optional sampling fields the served engines honour (the others are
refused with 400, so they are left out of the request schemas), and whether an
authentication plugin is on (then a bearer ``securityScheme`` covers every path outside
``auth_allow_paths``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from servehall.api import admin_config as admin
from servehall.api import batches as batch_api
from servehall.api import files as file_api
from servehall.api import responses_wire as rw
from servehall.api import wire as m
from servehall.api import wire_replies as out
from servehall.batches.wire import BatchList, BatchObject
from servehall.files.wire import FileDeleted, FileList, FileObject
from servehall.version import __version__

_ERRORS = {
    "400": "Invalid request (validation; prompt + max_tokens over the model's context: "
    "context_length_exceeded; content filter; unsupported parameter)",
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


def _event(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event of a stream (OpenAPI 3.1: the ``text/event-stream`` schema
    describes each event): ``data`` is a JSON chunk, a JSON error envelope (an engine
    failure mid-stream), or the final ``[DONE]``."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [_ref(chunk), _ref(out.ErrorResponse)]},
                    },
                ]
            }
        },
    }


def _errors() -> dict[str, Any]:
    return {
        code: {"description": d, "content": _json(out.ErrorResponse)} for code, d in _ERRORS.items()
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
                    "content": {**_json(resp), "text/event-stream": {"schema": _event(chunk)}},
                },
                **_errors(),
            },
        }
    }


def _tokenizer_paths(max_token_id: int | None) -> dict[str, Any]:
    """``/tokenize`` (a prompt or messages: one of the two request schemas) and
    ``/detokenize``."""
    tokenize_body = {"oneOf": [_ref(m.TokenizeCompletionRequest), _ref(m.TokenizeChatRequest)]}
    return {
        "/tokenize": {
            "post": {
                "summary": "Token ids of a prompt or of a chat as the model sees it",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": tokenize_body}},
                },
                "responses": {
                    "200": {"description": "The ids", "content": _json(out.TokenizeResponse)},
                    **_errors(),
                },
            }
        },
        "/detokenize": {
            "post": {
                "summary": "The text of token ids"
                + (f" (0 to {max_token_id})" if max_token_id is not None else ""),
                "requestBody": {"required": True, "content": _json(m.DetokenizeRequest)},
                "responses": {
                    "200": {"description": "The text", "content": _json(out.DetokenizeResponse)},
                    **_errors(),
                },
            }
        },
    }


def _embeddings_path() -> dict[str, Any]:
    """``/v1/embeddings`` (listed when the server serves an embedding model)."""
    return {
        "/v1/embeddings": {
            "post": {
                "summary": "Embeddings of texts or token arrays",
                "requestBody": {"required": True, "content": _json(m.EmbeddingRequest)},
                "responses": {
                    "200": {"description": "The vectors", "content": _json(out.EmbeddingResponse)},
                    **_errors(),
                },
            }
        }
    }


def _responses_paths() -> dict[str, Any]:
    """``/v1/responses`` (create; with ``stream: true`` Responses events) and
    ``/v1/responses/{response_id}`` (retrieve, delete a stored response)."""
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "pattern": "^(response\\.|error$)"},
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
    }
    not_found = {k: v for k, v in _errors().items() if k in ("401", "403", "404", "503")}
    param = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "/v1/responses": {
            "post": {
                "summary": "Create a model response (OpenAI's Responses API)",
                "requestBody": {"required": True, "content": _json(rw.ResponsesRequest)},
                "responses": {
                    "200": {
                        "description": "The response; with stream=true, server-sent events "
                        "(`event: response.created` … `event: response.completed`).",
                        "content": {
                            **_json(rw.ResponseObject),
                            "text/event-stream": {"schema": event},
                        },
                    },
                    **_errors(),
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response of the caller",
                "parameters": param,
                "responses": {
                    "200": {"description": "The response", "content": _json(rw.ResponseObject)},
                    **not_found,
                },
            },
            "delete": {
                "summary": "Delete a stored response of the caller",
                "parameters": param,
                "responses": {
                    "200": {"description": "Deleted", "content": _json(rw.ResponseDeleted)},
                    **not_found,
                },
            },
        },
    }


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json(out.ErrorResponse)}


_NEEDS_INFERENCE = "The credential lacks the 'inference' scope (insufficient_scope)"
_FILES_DOWN = "The file store or the database failed (files_unavailable, Retry-After)"


def _limit(most: int, default: int) -> dict[str, Any]:
    return {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": most, "default": default},
    }


def _after(what: str) -> dict[str, Any]:
    return {
        "name": "after",
        "in": "query",
        "required": False,
        "description": f"The id of a {what} of the caller: the page after it "
        f"(an id of no {what} of the caller is a 400)",
        "schema": {"type": "string"},
    }


def _path_param(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}]


def _files_paths(model: str) -> dict[str, Any]:
    """``/v1/files`` and ``/v1/files/{file_id}[/content]`` (:mod:`servehall.api.files`);
    the upload's example is a one-line batch file of a completion of ``model``."""
    line = {
        "custom_id": "request-1",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": model, "prompt": "Hello", "max_tokens": 2},
    }
    common = {"403": _error(_NEEDS_INFERENCE), "503": _error(_FILES_DOWN)}
    missing = _error("No file of the caller has this id (file_not_found)")
    param = _path_param("file_id")
    return {
        "/v1/files": {
            "post": {
                "summary": "Upload a batch input file",
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": file_api.UPLOAD_FORM,
                            "example": {"file": json.dumps(line) + "\n", "purpose": "batch"},
                        }
                    },
                },
                "responses": {
                    "200": {"description": "The file object", "content": _json(FileObject)},
                    "400": _error(
                        "No 'file' or 'purpose', a purpose other than "
                        f"{', '.join(file_api.PURPOSES)} (unsupported_purpose), a line "
                        "that is no batch request (invalid_batch_file, naming the line), "
                        "a broken multipart body (invalid_multipart)"
                    ),
                    "413": _error("The file is over [files] max_bytes"),
                    "415": _error("The body is not multipart/form-data"),
                    **common,
                },
            },
            "get": {
                "summary": "The caller's files, newest first",
                "parameters": [
                    {
                        "name": "purpose",
                        "in": "query",
                        "required": False,
                        "description": "Only files of this purpose",
                        "schema": {"type": "string"},
                    },
                    _limit(file_api.MAX_LIST, file_api.MAX_LIST),
                    _after("file"),
                    {
                        "name": "order",
                        "in": "query",
                        "required": False,
                        "schema": {
                            "type": "string",
                            "enum": list(file_api.LIST_ORDERS),
                            "default": "desc",
                        },
                    },
                ],
                "responses": {
                    "200": {"description": "A page of files", "content": _json(FileList)},
                    "400": _error("A bad 'limit' or 'order'; 'after' names no file of the caller"),
                    **common,
                },
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "summary": "A file of the caller",
                "parameters": param,
                "responses": {
                    "200": {"description": "The file object", "content": _json(FileObject)},
                    "404": missing,
                    **common,
                },
            },
            "delete": {
                "summary": "Delete a file of the caller",
                "parameters": param,
                "responses": {
                    "200": {"description": "Deleted", "content": _json(FileDeleted)},
                    "404": missing,
                    **common,
                },
            },
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "summary": "The bytes of a file of the caller, as uploaded",
                "parameters": param,
                "responses": {
                    "200": {
                        "description": "The content",
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}
                            }
                        },
                    },
                    "404": _error(
                        "No file of the caller has this id (file_not_found), or the store "
                        "lost its content (file_content_missing)"
                    ),
                    **common,
                },
            }
        },
    }


def _batches_paths() -> dict[str, Any]:
    """``/v1/batches`` and ``/v1/batches/{batch_id}[/cancel]``
    (:mod:`servehall.api.batches`)."""
    common = {"403": _error(_NEEDS_INFERENCE), "503": _error(_FILES_DOWN)}
    missing = _error("No batch of the caller has this id (batch_not_found)")
    param = _path_param("batch_id")
    return {
        "/v1/batches": {
            "post": {
                "summary": "Create a batch of the lines of an uploaded file",
                "requestBody": {"required": True, "content": _json(batch_api.BatchCreateRequest)},
                "responses": {
                    "200": {"description": "The batch (validating)", "content": _json(BatchObject)},
                    "400": _error(
                        "Invalid JSON or fields (unsupported_endpoint for another endpoint); "
                        "the input file's purpose is not batch, or a line's url is not the "
                        "endpoint (invalid_batch_file)"
                    ),
                    "404": _error(
                        "No file of the caller has this input_file_id (file_not_found), or "
                        "the store lost its content (file_content_missing)"
                    ),
                    "413": _error("Body over [server] max_body_bytes"),
                    "415": _error("Content-Type is not application/json"),
                    **common,
                },
            },
            "get": {
                "summary": "The caller's batches, newest first",
                "parameters": [
                    _limit(batch_api.MAX_LIST, batch_api.DEFAULT_LIST),
                    _after("batch"),
                ],
                "responses": {
                    "200": {"description": "A page of batches", "content": _json(BatchList)},
                    "400": _error("A bad 'limit'; 'after' names no batch of the caller"),
                    **common,
                },
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {
                "summary": "A batch of the caller",
                "parameters": param,
                "responses": {
                    "200": {"description": "The batch", "content": _json(BatchObject)},
                    "404": missing,
                    **common,
                },
            }
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "summary": "Cancel a validating or in_progress batch (one already "
                "cancelling or cancelled is answered as it is)",
                "parameters": param,
                "responses": {
                    "200": {
                        "description": "The batch (cancelling or cancelled)",
                        "content": _json(BatchObject),
                    },
                    "404": missing,
                    "409": _error("The batch ended otherwise (batch_not_cancellable)"),
                    **common,
                },
            }
        },
    }


def _admin_paths() -> dict[str, Any]:
    """``/admin/config`` (:mod:`servehall.api.admin_config`)."""
    common = {
        "401": _error("No credential (the admin scope is needed)"),
        "403": _error("The credential lacks the 'admin' scope (insufficient_scope)"),
        "409": _error("Live config changes are off on this server (config_live_off)"),
    }
    return {
        "/admin/config": {
            "get": {
                "summary": "The running config revision and its text (secrets redacted)",
                "responses": {
                    "200": {"description": "The config", "content": _json(admin.ConfigReport)},
                    **common,
                },
            },
            "post": {
                "summary": "Validate and apply a config live (only [[models]] may change)",
                "requestBody": {"required": True, "content": _json(admin.ConfigChange)},
                "responses": {
                    "200": {"description": "What changed", "content": _json(admin.ConfigApplied)},
                    "400": _error(
                        "Not JSON, no 'text', a bad 'format', or a config that is invalid or "
                        "changes more than [[models]] (config_invalid: every error listed; "
                        "nothing changed)"
                    ),
                    "413": _error(
                        f"A body over {admin.MAX_CONFIG_BYTES} bytes (payload_too_large)"
                    ),
                    **common,
                },
            },
        }
    }


def _cap(prop: dict[str, Any] | None, maximum: int) -> None:
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "integer":
            branch["maximum"] = min(int(branch.get("maximum", maximum)), maximum)


def _restrict_requests(
    defs: dict[str, Any],
    max_n: int | None,
    unsupported: Iterable[str],
    models: Sequence[str],
    max_model_len: int | None,
    max_token_id: int | None = None,
    embedding_models: Sequence[str] = (),
) -> None:
    drop = set(unsupported)
    props = defs.get("EmbeddingRequest", {}).get("properties", {})
    if embedding_models and "model" in props:
        props["model"]["enum"] = list(embedding_models)
    for name in ("TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest"):
        props = defs.get(name, {}).get("properties", {})
        if models and "model" in props:
            for branch in props["model"].get("anyOf", [props["model"]]):
                if branch.get("type") == "string":
                    branch["enum"] = list(models)
    if max_token_id is not None:
        tokens = defs.get("DetokenizeRequest", {}).get("properties", {}).get("tokens", {})
        _cap(tokens.get("items"), max_token_id)
    responses = defs.get("ResponsesRequest", {})
    if responses:
        # ``text.format`` is left out as chat's ``response_format`` is (its schema's
        # checks are the request path's); ``input`` may be left out only with a stored
        # ``previous_response_id``, so the document asks for it
        rprops = responses.get("properties", {})
        rprops.pop("text", None)
        rprops["input"]["anyOf"] = [
            b for b in rprops["input"].get("anyOf", []) if b.get("type") != "null"
        ]
        responses["required"] = sorted({*responses.get("required", []), "input"})
        for field in drop:
            rprops.pop(field, None)
        if max_model_len is not None:
            _cap(rprops.get("max_output_tokens"), max_model_len - 1)
        if models:
            rprops["model"]["enum"] = list(models)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = defs.get(name, {}).get("properties", {})
        for field in drop:
            props.pop(field, None)
        if max_n is not None:
            _cap(props.get("n"), max_n)
        if max_model_len is not None:  # the prompt takes at least one token
            _cap(props.get("max_tokens"), max_model_len - 1)
            _cap(props.get("max_completion_tokens"), max_model_len - 1)
        if models and "model" in props:
            props["model"]["enum"] = list(models)


def openapi_document(
    *,
    max_n: int | None = None,
    unsupported: Iterable[str] = (),
    bearer_auth: bool = False,
    public_paths: Iterable[str] = (),
    models: Sequence[str] = (),
    max_model_len: int | None = None,
    max_token_id: int | None = None,
    embedding_models: Sequence[str] = (),
) -> dict[str, Any]:
    """The document for one server (stable for a given version and configuration).

    What stays dynamic — prompt + ``max_tokens`` over the model's context (400
    ``context_length_exceeded``), a model outside the caller's allow-list (404/403),
    filters, rate limits — is listed among each operation's error responses.

    Args:
        max_n: ``[server] max_n``; the schema's maximum of ``n`` (None: the model's 128).
        models: the served model names (of ``task = "generate"``): chat's and
            completions' ``model`` becomes an ``enum`` of them.
        embedding_models: the served ``task = "embed"`` model names: ``/v1/embeddings``
            is listed (its ``model`` an ``enum`` of them) only when there is one.
        max_model_len: the largest served context: ``max_tokens`` above it - 1 can never
            be served, so the schema's maximum says so.
        max_token_id: the largest token id every served model's vocabulary holds:
            ``/detokenize``'s ``tokens`` items are bounded by it.
        unsupported: optional sampling fields (``top_k``, ``min_p`` …) that some served
            engine refuses; they are left out of the request schemas.
        bearer_auth: an authentication plugin is enabled: declare ``Authorization:
            Bearer`` as the security scheme of every path not in ``public_paths``.
        public_paths: ``[server] auth_allow_paths`` (no credential needed).
    """
    schema_models: list[type[BaseModel]] = [
        m.ChatCompletionRequest,
        out.ChatCompletion,
        out.ChatCompletionChunk,
        m.CompletionRequest,
        out.Completion,
        out.ModelList,
        out.ModelCard,
        m.TokenizeCompletionRequest,
        m.TokenizeChatRequest,
        out.TokenizeResponse,
        m.DetokenizeRequest,
        out.DetokenizeResponse,
        out.ErrorResponse,
        rw.ResponsesRequest,
        rw.ResponseObject,
        rw.ResponseDeleted,
        FileObject,
        FileList,
        FileDeleted,
        batch_api.BatchCreateRequest,
        BatchObject,
        BatchList,
        admin.ConfigChange,
        admin.ConfigReport,
        admin.ConfigApplied,
    ]
    if embedding_models:
        schema_models += [m.EmbeddingRequest, out.EmbeddingResponse]
    _, defs = models_json_schema(
        [
            (
                x,
                "validation"
                if x.__name__.endswith("Request") or x is admin.ConfigChange
                else "serialization",
            )
            for x in schema_models
        ],
        ref_template="#/components/schemas/{model}",
    )
    defs = copy.deepcopy(defs)
    schemas: dict[str, Any] = defs.get("$defs", {})
    _restrict_requests(
        schemas, max_n, unsupported, models, max_model_len, max_token_id, embedding_models
    )
    health = {
        "get": {
            "summary": "",
            "responses": {"200": {"description": "OK"}, "503": {"description": "Not ready"}},
        }
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "servehall",
            "version": __version__,
            "description": "OpenAI-compatible inference API.",
        },
        "paths": {
            "/v1/chat/completions": _inference(
                m.ChatCompletionRequest,
                out.ChatCompletion,
                out.ChatCompletionChunk,
                "Create a chat completion",
            ),
            "/v1/completions": _inference(
                m.CompletionRequest, out.Completion, out.Completion, "Create a text completion"
            ),
            **(_embeddings_path() if embedding_models else {}),
            **_tokenizer_paths(max_token_id),
            **_responses_paths(),
            **_files_paths(models[0] if models else "model"),
            **_batches_paths(),
            **_admin_paths(),
            "/v1/models": {
                "get": {
                    "summary": "Models the caller may use",
                    "responses": {
                        "200": {"description": "Model list", "content": _json(out.ModelList)},
                        **{k: v for k, v in _errors().items() if k == "401"},
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model, if the caller may use it",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {
                                "type": "string",
                                **({"enum": list(models)} if models else {}),
                            },
                        }
                    ],
                    "responses": {
                        "200": {"description": "The model", "content": _json(out.ModelCard)},
                        **{k: v for k, v in _errors().items() if k in ("401", "404")},
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
        "components": {"schemas": schemas},
    }
    doc["paths"]["/openapi.json"] = {
        "get": {
            "summary": "This document",
            "responses": {"200": {"description": "OpenAPI 3.1 document"}},
        }
    }
    if bearer_auth:
        public = set(public_paths)
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "API key or JWT"}
        }
        unauthorized = {"description": _ERRORS["401"], "content": _json(out.ErrorResponse)}
        for path, item in doc["paths"].items():
            for op in item.values():
                if path in public:
                    op["security"] = []
                else:
                    op["security"] = [{"bearer": []}]
                    op["responses"].setdefault("401", unauthorized)
    return doc
