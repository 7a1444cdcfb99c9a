"""``servehall.api.openapi.openapi_document``: the document follows the server's
configuration — model enums, ``n`` and ``max_tokens`` bounds, token id bounds, sampling
fields an engine refuses left out, the embeddings path only with an embedding model,
bearer security except on public paths — and every ``$ref`` resolves."""

from __future__ import annotations

import json
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
