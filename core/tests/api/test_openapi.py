"""``servehall.api.openapi.openapi_document``: the document follows the server's
configuration — model enums, ``n`` and ``max_tokens`` bounds, token id bounds, sampling
fields an engine refuses left out, the embeddings path only with an embedding model,
bearer security except on public paths — and every ``$ref`` resolves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import servehall
from servehall.api.openapi import openapi_document


def _props(doc: dict[str, Any], schema: str) -> dict[str, Any]:
    props: dict[str, Any] = doc["components"]["schemas"][schema]["properties"]
    return props


def _int_bound(prop: dict[str, Any]) -> dict[str, Any]:
    """The integer branch of an ``anyOf: [integer, null]`` property (or the property)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "integer":
            return dict(branch)
    raise AssertionError(prop)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return out + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_defaults() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] == "servehall" and doc["info"]["version"] == servehall.__version__
    assert "/v1/embeddings" not in doc["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health/ready"} <= set(
        doc["paths"]
    )
    assert "securitySchemes" not in doc["components"]
    assert _int_bound(_props(doc, "ChatCompletionRequest")["n"])["maximum"] == 128
    assert "enum" not in _props(doc, "ChatCompletionRequest")["model"]
    assert "top_k" in _props(doc, "ChatCompletionRequest")


def test_every_ref_resolves_and_the_document_is_json() -> None:
    doc = openapi_document(models=["m"], embedding_models=["e"], bearer_auth=True)
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    json.dumps(doc)


def test_configuration_shapes_the_schemas() -> None:
    doc = openapi_document(
        max_n=4,
        unsupported=["top_k"],
        models=["a", "b"],
        max_model_len=100,
        max_token_id=399,
        embedding_models=["e"],
    )
    chat = _props(doc, "ChatCompletionRequest")
    assert chat["model"]["enum"] == ["a", "b"]
    assert _int_bound(chat["n"])["maximum"] == 4
    assert _int_bound(chat["max_tokens"])["maximum"] == 99
    assert "top_k" not in chat and "top_k" not in _props(doc, "CompletionRequest")
    assert _props(doc, "CompletionRequest")["model"]["enum"] == ["a", "b"]
    tokens = _props(doc, "DetokenizeRequest")["tokens"]
    assert tokens["items"]["maximum"] == 399 and tokens["items"]["minimum"] == 0
    assert "/v1/embeddings" in doc["paths"]
    assert _props(doc, "EmbeddingRequest")["model"]["enum"] == ["e"]


def test_bearer_security_except_public_paths() -> None:
    doc = openapi_document(bearer_auth=True, public_paths=["/health/live", "/health/ready"])
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health/live"]["get"]["security"] == []
    assert doc["paths"]["/health/ready"]["get"]["security"] == []
    assert doc["paths"]["/v1/models"]["get"]["security"] == [{"bearer": []}]
    assert doc["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearer": []}]
    errors = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "429", "503"} <= set(errors)


def test_stable_for_one_configuration() -> None:
    kw: dict[str, Any] = {"models": ["m"], "max_n": 2, "bearer_auth": True}
    assert json.dumps(openapi_document(**kw), sort_keys=True) == json.dumps(
        openapi_document(**kw), sort_keys=True
    )


# --- Files, Batch and admin routes --------------------------------------------------------

REST_OPERATIONS = {
    "/v1/files": {"get", "post"},
    "/v1/files/{file_id}": {"get", "delete"},
    "/v1/files/{file_id}/content": {"get"},
    "/v1/batches": {"get", "post"},
    "/v1/batches/{batch_id}": {"get"},
    "/v1/batches/{batch_id}/cancel": {"post"},
    "/admin/config": {"get", "post"},
}


def _schema(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a top-level ``$ref`` resolved."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        out: dict[str, Any] = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        return out
    return node


def _param(op: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for p in op.get("parameters", []) if p["name"] == name]
    assert len(found) == 1, (name, op.get("parameters"))
    return dict(found[0])


def test_files_batches_and_admin_paths_are_listed_with_their_methods() -> None:
    doc = openapi_document()
    for path, methods in REST_OPERATIONS.items():
        assert set(doc["paths"][path]) == methods, path
    errors = {
        ("/v1/files", "post"): {"400", "403", "413", "415", "503"},
        ("/v1/files", "get"): {"400", "403", "503"},
        ("/v1/files/{file_id}", "get"): {"403", "404", "503"},
        ("/v1/files/{file_id}", "delete"): {"403", "404", "503"},
        ("/v1/files/{file_id}/content", "get"): {"403", "404", "503"},
        ("/v1/batches", "post"): {"400", "403", "404", "413", "415", "503"},
        ("/v1/batches", "get"): {"400", "403", "503"},
        ("/v1/batches/{batch_id}", "get"): {"403", "404", "503"},
        ("/v1/batches/{batch_id}/cancel", "post"): {"403", "404", "409", "503"},
        ("/admin/config", "get"): {"401", "403", "409"},
        ("/admin/config", "post"): {"400", "401", "403", "409", "413"},
    }
    for (path, method), codes in errors.items():
        responses = doc["paths"][path][method]["responses"]
        assert set(responses) == {"200"} | codes, (path, method)
        for code in codes:
            assert responses[code]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"
            }
    assert (
        "file_not_found"
        in doc["paths"]["/v1/files/{file_id}"]["get"]["responses"]["404"]["description"]
    )
    assert (
        "batch_not_found"
        in doc["paths"]["/v1/batches/{batch_id}"]["get"]["responses"]["404"]["description"]
    )


def test_request_shapes_come_from_the_handlers_constants() -> None:
    from servehall.api import admin_config, batches, files
    from servehall.files.validate import BATCH_URLS

    doc = openapi_document()
    upload = doc["paths"]["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]
    form = upload["schema"]
    assert form["required"] == ["file", "purpose"]
    assert form["properties"]["file"] == {**form["properties"]["file"], "format": "binary"}
    assert form["properties"]["purpose"]["enum"] == list(files.PURPOSES)
    assert upload["example"]["purpose"] == "batch"

    body = doc["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]
    create = _schema(doc, body["schema"])
    assert set(create["required"]) == {"input_file_id", "endpoint", "completion_window"}
    props = create["properties"]
    assert props["endpoint"]["enum"] == list(BATCH_URLS)
    assert props["completion_window"]["enum"] == list(batches.COMPLETION_WINDOWS)
    meta = next(b for b in props["metadata"]["anyOf"] if b.get("type") == "object")
    assert meta["maxProperties"] == batches.MAX_METADATA
    assert meta["propertyNames"]["maxLength"] == batches.MAX_METADATA_KEY
    assert meta["additionalProperties"] == {
        "type": "string",
        "maxLength": batches.MAX_METADATA_VALUE,
    }

    files_limit = _param(doc["paths"]["/v1/files"]["get"], "limit")["schema"]
    assert (files_limit["minimum"], files_limit["maximum"]) == (1, files.MAX_LIST)
    assert _param(doc["paths"]["/v1/files"]["get"], "order")["schema"]["enum"] == list(
        files.LIST_ORDERS
    )
    batch_limit = _param(doc["paths"]["/v1/batches"]["get"], "limit")["schema"]
    assert (batch_limit["maximum"], batch_limit["default"]) == (
        batches.MAX_LIST,
        batches.DEFAULT_LIST,
    )
    for path in ("/v1/files", "/v1/batches"):
        assert _param(doc["paths"][path]["get"], "after")["schema"] == {"type": "string"}

    change = doc["paths"]["/admin/config"]["post"]["requestBody"]["content"]["application/json"]
    change_schema = _schema(doc, change["schema"])
    assert change_schema["required"] == ["text"]
    assert change_schema["properties"]["format"]["enum"] == list(admin_config.FORMATS)


def test_response_shapes_are_what_the_handlers_emit() -> None:
    """The file and batch objects the store builds validate against the document's
    schemas (the same models), and the list and delete answers too."""
    from datetime import UTC, datetime

    import jsonschema

    from servehall.batches.store import Batch
    from servehall.files.catalog import FileRow

    doc = openapi_document()

    def check(schema_name: str, value: Any) -> None:
        schema = {"$ref": f"#/components/schemas/{schema_name}", **doc}
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)

    now = datetime.now(UTC)
    row = FileRow("file-1", "o", "in.jsonl", "batch", 10, now, "00", "file-1")
    check("FileObject", row.wire())
    check(
        "FileList",
        {
            "object": "list",
            "data": [row.wire()],
            "first_id": "file-1",
            "last_id": "file-1",
            "has_more": False,
        },
    )
    check(
        "FileList",
        {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False},
    )
    batch = Batch(
        id="batch_1",
        owner="o",
        principal={},
        endpoint="/v1/completions",
        input_file_id="file-1",
        completion_window="24h",
        status="in_progress",
        metadata={"k": "v"},
        times={"created_at": now, "expires_at": now, "in_progress_at": now},
        output_file_id=None,
        error_file_id=None,
        counts={"total": 2, "completed": 1, "failed": 0},
    )
    wire = batch.wire()
    check("BatchObject", wire)
    assert wire["cancelled_at"] is None and wire["created_at"] == int(now.timestamp())
    check(
        "BatchList",
        {
            "object": "list",
            "data": [wire],
            "first_id": "batch_1",
            "last_id": "batch_1",
            "has_more": True,
        },
    )
    bad = {**wire, "status": "done"}
    try:
        check("BatchObject", bad)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("a status outside OpenAI's is valid")


def test_bearer_security_on_the_new_paths() -> None:
    doc = openapi_document(bearer_auth=True, public_paths=["/health/live"])
    for path, methods in REST_OPERATIONS.items():
        for method in methods:
            op = doc["paths"][path][method]
            assert op["security"] == [{"bearer": []}], (path, method)
            assert "401" in op["responses"], (path, method)
    assert "admin" in doc["paths"]["/admin/config"]["post"]["responses"]["403"]["description"]


def test_every_core_route_is_in_the_document(tmp_path: Path) -> None:
    """Each path and method the app routes (``/v1/embeddings`` with an embedding model,
    ``HEAD`` aside) is an operation of the document."""
    from starlette.routing import Route

    from servehall.api.app import create_app
    from servehall.plugin.host import Host
    from servehall.server.bootstrap import load_deployment

    config = tmp_path / "c.toml"
    config.write_text(f'[files]\ndir = "{tmp_path / "files"}"\n')
    settings, plugins = load_deployment(config)
    app = create_app(Host(settings=settings, plugins=plugins))
    doc = openapi_document(embedding_models=["e"])
    routed = {
        (r.path.replace(":path}", "}"), m.lower())
        for r in app.routes
        if isinstance(r, Route)
        for m in (r.methods or ()) - {"HEAD"}
    }
    listed = {(p, m) for p, item in doc["paths"].items() for m in item}
    assert routed == listed
