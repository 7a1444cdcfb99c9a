"""Structured output end to end: ``response_format`` and guided decoding on a real server.

One ``servehall serve`` subprocess (demo model, ``openvino_cpu``) serves the module. The
demo model's weights are random, so every output that validates was enforced by the
grammar. For a corpus of schemas (objects, nested, bounded arrays, enums, ``anyOf``,
``$defs``/``$ref``): each output validates with ``jsonschema``, ends with
``finish_reason: "stop"`` within 64 tokens, and the streamed text equals the
non-streamed text for the same seed. Malformed or unenforceable schemas are a 400 in the
OpenAI envelope naming the field, streamed and not, in every field that carries a schema
(``servehall.testing.bad_schemas``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from servehall.testing.bad_schemas import BAD_SCHEMAS, DRAFT_07, schema_bodies
from tests.conftest import ServerHandle, demo_config

SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "ok": {"type": "boolean"},
                },
                "required": ["id", "ok"],
            }
        },
        "required": ["user"],
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 1,
        "maxItems": 3,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "anyof": {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": 99},
            {"type": "boolean"},
            {"type": "null"},
        ]
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "exclusiveMinimum": -1, "maximum": 9}},
                "required": ["x"],
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
    },
    # no bounds stated: the default bounds (15 digits, 6 fraction digits) still close it
    "unbounded": {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "x": {"type": "number"}},
        "required": ["n", "x"],
    },
}
SEEDS = (0, 1, 2)


MODELS = ("demo", "demo-torch")  # openvino_cpu, and the torch engine on the CPU


@pytest.fixture(scope="module")
def server(servehall_server: Any, demo_model_dir: Any) -> Iterator[ServerHandle]:
    cfg = demo_config(demo_model_dir)
    cfg["models"].append(
        {
            "name": "demo-torch",
            "path": str(demo_model_dir),
            "backend": "cpu",
            "options": {"dtype": "float32"},
        }
    )
    with servehall_server(cfg, ready_timeout=600) as srv:  # two models load in turn
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, http2=True, timeout=120) as c:
        yield c


def _body(schema: dict[str, Any], seed: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": extra.pop("model", "demo"),
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 64,
        "temperature": 1.0,
        "seed": seed,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
        **extra,
    }


def _streamed(client: httpx.Client, body: dict[str, Any]) -> tuple[str, str | None]:
    text, finish = "", None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    return text, finish


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_corpus_valid_stop_and_stream_equal(
    client: httpx.Client, name: str, model: str
) -> None:
    schema = SCHEMAS[name]
    for seed in SEEDS:
        r = client.post("/v1/chat/completions", json=_body(schema, seed, model=model))
        assert r.status_code == 200, r.text
        out = r.json()
        choice = out["choices"][0]
        text = choice["message"]["content"]
        jsonschema.validate(json.loads(text), schema)
        assert choice["finish_reason"] == "stop", (name, seed, text)
        assert out["usage"]["completion_tokens"] <= 64
        streamed = _streamed(client, _body(schema, seed, model=model))
        assert streamed == (text, "stop"), (name, seed)


def test_json_object_completions_regex_and_choice(client: httpx.Client) -> None:
    r = client.post(
        "/v1/completions",
        json={
            "model": "demo",
            "prompt": "x",
            "max_tokens": 64,
            "seed": 3,
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a free-form object may run out of budget; it is still an object's prefix
        assert text.startswith("{")
    r = client.post(
        "/v1/chat/completions",
        json={**_body({}, 1), "response_format": None, "guided_regex": "[a-c]{2,4}-[0-9]"},
    )
    assert r.status_code == 200, r.text
    assert re.fullmatch("[a-c]{2,4}-[0-9]", r.json()["choices"][0]["message"]["content"])
    r = client.post(
        "/v1/chat/completions",
        json={
            **_body({}, 2),
            "response_format": None,
            "structured_outputs": {"choice": ["alpha", "beta gamma"]},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("alpha", "beta gamma")


def test_empty_schema_is_bounded_json(client: httpx.Client) -> None:
    for seed in SEEDS:
        r = client.post("/v1/chat/completions", json=_body({}, seed, max_tokens=32))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        if choice["finish_reason"] == "stop":
            json.loads(choice["message"]["content"])
        assert not choice["message"]["content"].startswith((" ", "\n"))


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog"]
    legs: int = pydantic.Field(ge=0, le=4)
    vaccinated: bool


def test_openai_sdk_parse_pydantic(server: ServerHandle) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    done = client.chat.completions.parse(
        model="demo",
        messages=[{"role": "user", "content": "A pet, please."}],
        response_format=Pet,
        max_tokens=64,
        seed=4,
    )
    pet = done.choices[0].message.parsed
    assert isinstance(pet, Pet), done.choices[0].message.content


BAD: list[tuple[dict[str, Any], int, str]] = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "nope"}},
            }
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "integer", "multipleOf": 2}},
            }
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "string", "format": "credit-card"}},
            }
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"$ref": "#/$defs/none"}},
            }
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
        400,
        "response_format.json_schema.name",
    ),
    ({"response_format": {"type": "xml"}}, 400, "response_format.type"),
    ({"response_format": "json"}, 400, "response_format"),
    ({"guided_json": "{not json"}, 400, "guided_json"),
    ({"guided_choice": []}, 400, "guided_choice"),
    ({"guided_regex": "(unclosed"}, 400, "guided_regex"),
    ({"guided_grammar": "root ::= nothing_defined"}, 400, "guided_grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, 400, "structured_outputs"),
    ({"guided_json": {}, "guided_regex": "a"}, 400, "guided_regex"),
    ({"guided_whitespace_pattern": " *", "guided_json": {}}, 400, "guided_whitespace_pattern"),
]


@pytest.mark.parametrize(
    ("extra", "status", "param"), BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)]
)
def test_bad_constraints_are_400_envelopes(
    client: httpx.Client, extra: dict[str, Any], status: int, param: str
) -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 8,
        **extra,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    # the server is still fine afterwards
    ok = client.post("/v1/chat/completions", json=_body(SCHEMAS["enum"], 0))
    assert ok.status_code == 200


def test_metrics_count_outcomes_and_compiles(client: httpx.Client) -> None:
    """Runs last in the module: the requests above were counted."""
    text = client.get("/metrics").text

    def value(prefix: str) -> float:
        lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
        assert lines, prefix
        return float(lines[0].rsplit(" ", 1)[1])

    family = "servehall_structured_output_requests_total"
    for model in MODELS:
        valid = f'{family}{{kind="json_schema",model="{model}",outcome="valid",version=""}}'
        assert value(valid) >= 2 * len(SCHEMAS) * len(SEEDS)
        labels = f'{{model="{model}",version=""}}'
        assert value(f"servehall_grammar_compile_seconds_count{labels}") >= len(SCHEMAS)
        assert value(f"servehall_grammar_cache_hits_total{labels}") >= len(SCHEMAS)
    assert value(f'{family}{{kind="json_schema",model="demo",outcome="refused",version=""}}') >= 4
    assert value(f'{family}{{kind="grammar",model="demo-torch",outcome="length",version=""}}') == 0


@pytest.mark.parametrize("model", MODELS)
def test_engine_refusal_streamed_is_400_before_the_stream(client: httpx.Client, model: str) -> None:
    """A constraint only the engine can judge (a regex its compiler refuses) is a 400 for
    a streamed request too: the stream waits for the compile before its 200."""
    for extra in ({"guided_regex": "(unclosed"}, {"guided_grammar": "root ::= nothing_defined"}):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 8,
            "stream": True,
            **extra,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            r.read()
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        assert err["param"] == next(iter(extra)), err
    text, finish = _streamed(client, _body(SCHEMAS["enum"], 0, model=model))
    assert finish == "stop" and json.loads(text)["color"] in ("red", "green", "blue")


#: The malformed schemas of issue 33 that were 500s (a validator's TypeError).
MALFORMED = [
    {"$schema": {}},
    {"$schema": [1]},
    {"$schema": DRAFT_07, "$defs": {"a": {"type": 5}}},
    {"$schema": DRAFT_07, "$defs": {"a": {"type": "integer", "minimum": "x"}}},
    {"$schema": DRAFT_07, "type": "object", "$defs": 5},
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_malformed_schemas_are_400_in_every_field(
    client: httpx.Client, model: str, stream: bool
) -> None:
    """Each malformed schema, in each field that carries a schema (tool parameters under
    a forced choice included), is a 400 naming the field, streamed and not; on the
    OpenVINO engine the whole corpus of ``servehall.testing.bad_schemas`` too."""
    corpus = MALFORMED + ([s for s, _ in BAD_SCHEMAS] if model == "demo" and not stream else [])
    for schema in corpus:
        for param, body in schema_bodies(schema, model):
            body = {**body, "stream": stream}
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.read()
            assert r.status_code == 400, (schema, param, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error", err
            assert err["param"] == param, (schema, err)
    text, finish = _streamed(client, _body(SCHEMAS["enum"], 0, model=model))
    assert finish == "stop" and json.loads(text)["color"] in ("red", "green", "blue")
