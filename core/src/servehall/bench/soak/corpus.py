"""The soak's fixed inputs: malformed and hostile request bodies (the malformed and
unenforceable JSON Schemas of :mod:`servehall.testing.bad_schemas`, in every field that
carries a schema), JSON Schemas generated with that module's hypothesis strategy, and the
bodies real client libraries send (``data/sdk_bodies_*.json``,
recorded with ``record_sdk.py``).

Every function returns :class:`Shape` values ready to send; the model name is filled in
at build time. None of these may get a 5xx: a bad input is a 4xx envelope.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Any

from servehall.testing.bad_schemas import (
    BAD_SCHEMAS,
    UNENFORCEABLE_SCHEMAS,
    json_schemas,
    schema_bodies,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
FILES = "/v1/files"
EMBEDDINGS = "/v1/embeddings"
BATCHES = "/v1/batches"
RESPONSES = "/v1/responses"
_BOUNDARY = "soak-boundary-7f3a"


def multipart_upload(data: bytes, purpose: str = "batch") -> bytes:
    """A ``POST /v1/files`` body (``multipart/form-data`` with the boundary of
    :data:`MULTIPART_CTYPE`): a ``purpose`` field and ``data`` as the ``file`` part."""
    head = (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
        f'{purpose}\r\n--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        'filename="soak.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
    ).encode()
    return head + data + f"\r\n--{_BOUNDARY}--\r\n".encode()


MULTIPART_CTYPE = f"multipart/form-data; boundary={_BOUNDARY}"


@dataclass(frozen=True, slots=True)
class Shape:
    """One request to send.

    Attributes:
        name: what it is, for the report (``chat_stream``, ``bad_json``...).
        path: the URL path.
        body: the JSON body, or None when ``raw`` is sent instead.
        raw: bytes sent as is (malformed bodies).
        content_type: the request's ``content-type``.
        disconnect: read the first SSE event, then leave (a client disconnect).
    """

    name: str
    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None
    content_type: str = "application/json"
    disconnect: bool = False

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream") is True)

    def content(self) -> bytes:
        """The bytes of the request body."""
        if self.raw is not None:
            return self.raw
        return json.dumps(self.body).encode()


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **extra}


def hostile_shapes(model: str) -> list[Shape]:
    """Malformed JSON, wrong types, out-of-range numbers, unknown models, bad schemas,
    bad tools and odd encodings (a fixed corpus; every one must be a 4xx)."""
    out: list[Shape] = []

    def raw(name: str, data: bytes, ctype: str = "application/json", path: str = CHAT) -> None:
        out.append(Shape(name, path, raw=data, content_type=ctype))

    def body(name: str, b: dict[str, Any], path: str = CHAT) -> None:
        out.append(Shape(name, path, body=b))

    raw("bad_json", b"{not json")
    raw("empty_body", b"")
    raw("json_array", b"[1, 2, 3]")
    raw("json_string", b'"hello"')
    raw("truncated_json", b'{"model": "' + model.encode() + b'", "messages": [')
    raw("bad_utf8", b'{"model": "\xff\xfe", "messages": []}')
    raw(
        "nul_in_json",
        b'{"model": "demo\\u0000", "messages": [{"role": "user", "content": "\\u0000"}]}',
    )
    raw("lone_surrogate", b'{"model": "x", "messages": [{"role": "user", "content": "\\ud800"}]}')
    raw("text_plain", json.dumps(_chat(model)).encode(), ctype="text/plain")
    raw("deep_nesting", b"[" * 5000 + b"]" * 5000)
    raw("huge_number", b'{"model": "m", "max_tokens": 1' + b"0" * 400 + b"}", path=COMPLETIONS)
    raw("nan_literal", b'{"model": "m", "prompt": "a", "temperature": NaN}', path=COMPLETIONS)
    raw("duplicate_keys", b'{"model": "m", "model": 5, "prompt": "a"}', path=COMPLETIONS)
    body("no_model", {"messages": [{"role": "user", "content": "Hi"}]})
    body("unknown_model", _chat("no-such-model-\u00e9\u2603", max_tokens=2))
    body("model_wrong_type", {"model": 5, "messages": [{"role": "user", "content": "Hi"}]})
    body("messages_empty", _chat(model) | {"messages": []})
    body("messages_not_list", _chat(model) | {"messages": "Hi"})
    body("bad_role", _chat(model) | {"messages": [{"role": "wizard", "content": "Hi"}]})
    body("content_int", _chat(model) | {"messages": [{"role": "user", "content": 5}]})
    body(
        "bad_part", _chat(model) | {"messages": [{"role": "user", "content": [{"type": "image"}]}]}
    )
    body("max_tokens_negative", _chat(model, max_tokens=-1))
    body("max_tokens_zero", _chat(model, max_tokens=0))
    body("max_tokens_huge", _chat(model, max_tokens=2**63))
    body("max_tokens_float", _chat(model, max_tokens=1.5))
    body("max_tokens_string", _chat(model, max_tokens="8"))
    body("temperature_negative", _chat(model, temperature=-1, max_tokens=2))
    body("temperature_huge", _chat(model, temperature=1e308, max_tokens=2))
    body("top_p_zero", _chat(model, top_p=0, max_tokens=2))
    body("n_zero", _chat(model, n=0, max_tokens=2))
    body("n_huge", _chat(model, n=10**6, max_tokens=2))
    body("seed_huge", _chat(model, seed=2**80, max_tokens=2))
    body("stop_too_many", _chat(model, stop=["a", "b", "c", "d", "e"] * 10, max_tokens=2))
    body("stop_empty_string", _chat(model, stop=[""], max_tokens=2))
    body("stop_wrong_type", _chat(model, stop=5, max_tokens=2))
    body("stream_string", _chat(model, stream="yes", max_tokens=2))
    body("stream_options_bad", _chat(model, stream=True, stream_options={"include_usage": "y"}))
    body("logit_bias", _chat(model, logit_bias={"5": 100}, max_tokens=2))
    body("logprobs", _chat(model, logprobs=True, top_logprobs=2, max_tokens=2))
    body("priority_huge", _chat(model, priority=10**30, max_tokens=2))
    body("unknown_field", _chat(model, frobnicate=True, max_tokens=2))
    body("prompt_list_2", {"model": model, "prompt": ["a", "b"], "max_tokens": 2}, COMPLETIONS)
    body("prompt_tokens_ids", {"model": model, "prompt": [1, 2, 3], "max_tokens": 2}, COMPLETIONS)
    body("prompt_missing", {"model": model, "max_tokens": 2}, COMPLETIONS)
    body("echo_string", {"model": model, "prompt": "a", "echo": "y"}, COMPLETIONS)
    body("chat_on_completions", _chat(model, max_tokens=2), COMPLETIONS)
    # tools
    fn = {"name": "f", "parameters": {"type": "object"}}
    body("tools_not_list", _chat(model, tools={"type": "function"}))
    body("tool_no_function", _chat(model, tools=[{"type": "function"}]))
    body("tool_bad_name", _chat(model, tools=[{"type": "function", "function": {"name": "a b!"}}]))
    body(
        "tool_choice_unknown",
        _chat(
            model,
            tools=[{"type": "function", "function": fn}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
    )
    body(
        "tool_choice_bad_string",
        _chat(model, tools=[{"type": "function", "function": fn}], tool_choice="sometimes"),
    )
    body("tool_choice_without_tools", _chat(model, tool_choice="required"))
    body(
        "tool_params_not_object",
        _chat(
            model,
            tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}],
            tool_choice="required",
        ),
    )
    body(
        "tool_call_no_id",
        _chat(model)
        | {
            "messages": [
                {"role": "user", "content": "Hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            ]
        },
    )
    # structured output
    body("rf_bad_type", _chat(model, response_format={"type": "yaml"}))
    body("rf_not_object", _chat(model, response_format="json"))
    body("rf_schema_missing", _chat(model, response_format={"type": "json_schema"}))
    body(
        "rf_schema_name_bad",
        _chat(
            model,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a b", "schema": {"type": "object"}},
            },
        ),
    )
    for group, corpus in (("bad", BAD_SCHEMAS), ("unenforceable", UNENFORCEABLE_SCHEMAS)):
        for i, (schema, _why) in enumerate(corpus):
            for param, b in schema_bodies(schema, model):
                body(f"schema_{group}_{i}_{_FIELD_NAMES[param]}", b)
    for i, value in enumerate(NOT_SCHEMAS):
        rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": value}}
        body(f"rf_not_a_schema_{i}", _chat(model, response_format=rf, max_tokens=4))
        body(
            f"guided_json_not_a_schema_{i}",
            {"model": model, "prompt": "a", "max_tokens": 4, "guided_json": value},
            COMPLETIONS,
        )
    body("guided_regex_bad", {"model": model, "prompt": "a", "guided_regex": "(["}, COMPLETIONS)
    body(
        "guided_regex_huge",
        {"model": model, "prompt": "a", "max_tokens": 2, "guided_regex": "(a|b)" * 3000},
        COMPLETIONS,
    )
    body("guided_choice_empty", {"model": model, "prompt": "a", "guided_choice": []}, COMPLETIONS)
    body(
        "guided_choice_types",
        {"model": model, "prompt": "a", "guided_choice": [1, None]},
        COMPLETIONS,
    )
    body(
        "guided_two_kinds",
        {"model": model, "prompt": "a", "guided_regex": "a", "guided_choice": ["a"]},
        COMPLETIONS,
    )
    body(
        "guided_grammar_bad",
        {"model": model, "prompt": "a", "guided_grammar": "root ::= ("},
        COMPLETIONS,
    )
    body(
        "structured_outputs_bad",
        {"model": model, "prompt": "a", "structured_outputs": {"json": 5}},
        COMPLETIONS,
    )
    # /tokenize and /detokenize
    msgs = [{"role": "user", "content": "Hi"}]
    raw("tokenize_bad_json", b'{"prompt": ', path=TOKENIZE)
    raw("detokenize_text_plain", b'{"tokens": [1]}', ctype="text/plain", path=DETOKENIZE)
    body("tokenize_neither", {"model": model}, TOKENIZE)
    body("tokenize_both", {"model": model, "prompt": "a", "messages": msgs}, TOKENIZE)
    body("tokenize_prompt_int", {"model": model, "prompt": 5}, TOKENIZE)
    body("tokenize_prompt_ids", {"model": model, "prompt": [1, 2]}, TOKENIZE)
    body("tokenize_unknown_model", {"model": "no-such-model", "prompt": "a"}, TOKENIZE)
    body(
        "tokenize_special_string",
        {"model": model, "prompt": "a", "add_special_tokens": "yes"},
        TOKENIZE,
    )
    body("tokenize_messages_empty", {"model": model, "messages": []}, TOKENIZE)
    body(
        "tokenize_bad_role",
        {"model": model, "messages": [{"role": "wizard", "content": "x"}]},
        TOKENIZE,
    )
    body(
        "tokenize_continue_and_generation",
        {
            "model": model,
            "messages": msgs,
            "continue_final_message": True,
            "add_generation_prompt": True,
        },
        TOKENIZE,
    )
    body(
        "tokenize_reserved_template_kwarg",
        {"model": model, "messages": msgs, "chat_template_kwargs": {"chat_template": "x"}},
        TOKENIZE,
    )
    body(
        "tokenize_tool_choice_without_tools",
        {"model": model, "messages": msgs, "tool_choice": "required"},
        TOKENIZE,
    )
    body("detokenize_missing", {"model": model}, DETOKENIZE)
    body("detokenize_not_list", {"model": model, "tokens": "1 2 3"}, DETOKENIZE)
    body("detokenize_negative", {"model": model, "tokens": [1, -5]}, DETOKENIZE)
    body("detokenize_float", {"model": model, "tokens": [1.5]}, DETOKENIZE)
    body("detokenize_bool", {"model": model, "tokens": [True]}, DETOKENIZE)
    body("detokenize_out_of_vocab", {"model": model, "tokens": [1, 2**40]}, DETOKENIZE)
    body("detokenize_huge", {"model": model, "tokens": [2**70]}, DETOKENIZE)
    body("detokenize_unknown_model", {"model": "no-such-model", "tokens": [1]}, DETOKENIZE)
    # /v1/embeddings: the soak's model generates, so even a good body is a 400
    # (wrong_model_task); bad bodies are 400s (415 for the media type) all the same
    raw("embeddings_bad_json", b'{"input": ', path=EMBEDDINGS)
    raw("embeddings_text_plain", b'{"input": "a"}', ctype="text/plain", path=EMBEDDINGS)
    body("embeddings_generate_model", {"model": model, "input": "a"}, EMBEDDINGS)
    body("embeddings_input_int", {"model": model, "input": 5}, EMBEDDINGS)
    body("embeddings_input_empty", {"model": model, "input": []}, EMBEDDINGS)
    body("embeddings_tokens_negative", {"model": model, "input": [[1, -5]]}, EMBEDDINGS)
    body(
        "embeddings_bad_encoding",
        {"model": model, "input": "a", "encoding_format": "int8"},
        EMBEDDINGS,
    )
    body(
        "embeddings_dimensions_string",
        {"model": model, "input": "a", "dimensions": "8"},
        EMBEDDINGS,
    )
    body("embeddings_unknown_model", {"model": "no-such-model", "input": "a"}, EMBEDDINGS)

    # /v1/responses: what it does not implement, and bad items, are 400s naming the field
    def resp(name: str, **extra: Any) -> None:
        body(name, {"model": model, "input": "Hi", "store": False, **extra}, RESPONSES)

    resp("responses_reasoning", reasoning={"effort": "high"})
    resp("responses_web_search", tools=[{"type": "web_search"}])
    resp("responses_mcp", tools=[{"type": "mcp", "server_label": "x", "server_url": "http://x"}])
    resp("responses_background", background=True)
    resp("responses_include", include=["message.output_text.logprobs"])
    resp("responses_conversation", conversation="conv_1")
    resp("responses_image_part", input=[{"role": "user", "content": [{"type": "input_image"}]}])
    resp("responses_reasoning_item", input=[{"type": "reasoning", "summary": []}])
    resp("responses_no_input", input=None)
    resp("responses_input_int", input=5)
    resp("responses_max_output_zero", max_output_tokens=0)
    resp("responses_required_no_tools", tool_choice="required")
    resp("responses_unknown_previous", previous_response_id="resp_nope")
    resp(
        "responses_unknown_call",
        input=[{"type": "function_call_output", "call_id": "x", "output": "y"}],
    )
    resp("responses_unknown_model", model="no-such-model")
    resp("responses_bad_format", text={"format": {"type": "json_schema", "name": "x", "schema": 5}})
    # /v1/files: bad uploads are refused (400/415) before anything is stored
    line = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": _chat(model)})
    bad_files = {
        "files_malformed_line": (line + "\n{oops\n").encode(),
        "files_duplicate_custom_id": (line + "\n" + line + "\n").encode(),
        "files_unknown_url": line.replace(CHAT, "/v1/moderations").encode(),
        "files_empty": b"",
    }
    for name, data in bad_files.items():
        raw(name, multipart_upload(data), ctype=MULTIPART_CTYPE, path=FILES)
    raw("files_bad_purpose", multipart_upload(line.encode(), "fine-tune"), MULTIPART_CTYPE, FILES)
    raw("files_json_body", b'{"purpose": "batch"}', path=FILES)
    raw("files_broken_multipart", b"--nope\r\n", ctype=MULTIPART_CTYPE, path=FILES)
    # /v1/batches: bad creates are refused (400/404) before a batch exists; an unknown
    # file id reads exactly like another principal's (404 file_not_found)
    create = {"input_file_id": "file-0000soak", "endpoint": CHAT, "completion_window": "24h"}
    body("batches_unknown_file", create, BATCHES)
    body("batches_bad_endpoint", create | {"endpoint": "/v1/moderations"}, BATCHES)
    body("batches_bad_window", create | {"completion_window": "1h"}, BATCHES)
    body("batches_bad_metadata", create | {"metadata": {"k": 5}}, BATCHES)
    body("batches_no_file_id", {"endpoint": CHAT, "completion_window": "24h"}, BATCHES)
    raw("batches_bad_json", b'{"input_file_id": ', path=BATCHES)
    return out


NOT_SCHEMAS: list[Any] = [5, "object", [], None, True]
"""Values that are not a schema object where one is expected (the malformed and
unenforceable schema objects are :mod:`servehall.testing.bad_schemas`'s)."""

_FIELD_NAMES = {
    "response_format.json_schema.schema": "rf",
    "guided_json": "guided_json",
    "structured_outputs.json": "structured_outputs",
    "tools[0].function.parameters": "tool",
}
"""A short name for each field :func:`~servehall.testing.bad_schemas.schema_bodies`
fills, for the shape names."""


def generated_schemas(count: int, seed: int = 0) -> list[Any]:
    """``count`` JSON Schemas (valid and malformed) drawn from
    :func:`servehall.testing.bad_schemas.json_schemas`, deterministic for ``seed``;
    empty when hypothesis is not installed (a dev dependency)."""
    try:
        from hypothesis import HealthCheck, given, settings
    except ImportError:
        return []
    strategy = json_schemas(max_leaves=12)
    found: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(schema: Any) -> None:
        found.append(schema)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    # derandomize gives one sequence; the seed rotates it so runs can differ
    k = seed % len(found) if found else 0
    return found[k:] + found[:k]


def schema_shapes(model: str, schemas: list[Any]) -> list[Shape]:
    """Each schema in one of the fields that carry a schema (``response_format``,
    ``guided_json``, ``structured_outputs``, a forced tool's ``parameters``: the bodies of
    :func:`servehall.testing.bad_schemas.schema_bodies`), in turn; every other one
    streamed."""
    out: list[Shape] = []
    for i, schema in enumerate(schemas):
        bodies = schema_bodies(schema, model)
        param, b = bodies[i % len(bodies)]
        b = {**b, "stream": (i // len(bodies)) % 2 == 1}
        out.append(Shape(f"gen_schema_{_FIELD_NAMES[param]}", CHAT, b))
    return out


def sdk_shapes(model: str) -> list[Shape]:
    """The recorded client-library bodies (``data/sdk_bodies_*.json``), with ``model``
    and a short ``max_tokens``."""
    out: list[Shape] = []
    data_dir = resources.files("servehall.bench.soak") / "data"
    for entry in sorted(data_dir.iterdir(), key=lambda p: p.name):
        if not (entry.name.startswith("sdk_bodies_") and entry.name.endswith(".json")):
            continue
        rec = json.loads(entry.read_text(encoding="utf-8"))
        lib = rec["library"]
        for item in rec["bodies"]:
            body = dict(item["body"])
            if "model" in body:
                body["model"] = model
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(body.get(key), int):
                    body[key] = min(body[key], 16)
            if "max_tokens" not in body and "max_completion_tokens" not in body:
                body["max_tokens"] = 16
            path = "/v1" + item["path"].split("/v1", 1)[-1]
            out.append(Shape(f"sdk_{lib}_{item['name']}", path, body))
    return out


def sdk_libraries() -> list[str]:
    """``library version`` of each recording shipped with the soak."""
    out = []
    data_dir = resources.files("servehall.bench.soak") / "data"
    for entry in sorted(data_dir.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("sdk_bodies_") and entry.name.endswith(".json"):
            rec = json.loads(entry.read_text(encoding="utf-8"))
            out.append(f"{rec['library']} {rec['version']} ({len(rec['bodies'])} bodies)")
    return out
