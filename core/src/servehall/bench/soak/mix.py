"""The soak's traffic mix: every valid request shape the API accepts, client
disconnects, the recorded client-library bodies, the hostile corpus and generated
schemas, drawn by weight.

:class:`Mix` is deterministic for a seed; :meth:`Mix.counts` tells the report how many
shapes each category holds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from servehall.bench.soak.corpus import (
    CHAT,
    COMPLETIONS,
    DETOKENIZE,
    EMBEDDINGS,
    RESPONSES,
    TOKENIZE,
    Shape,
    generated_schemas,
    hostile_shapes,
    schema_shapes,
    sdk_shapes,
)

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def valid_shapes(model: str, max_tokens: int) -> list[Shape]:
    """The valid request shapes: chat and completions, plain and streamed (with and
    without ``include_usage``), ``n=2``, stops, tools with every ``tool_choice``,
    ``response_format`` json_object/json_schema, guided regex/choice/json,
    ``structured_outputs``; ``/v1/responses`` plain, stored, streamed, with tools, with
    ``text.format`` json_schema and with ``function_call`` / ``function_call_output``
    items."""
    mt = max_tokens
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me"}]
    usage = {"include_usage": True}
    chat: dict[str, dict[str, Any]] = {
        "chat": {},
        "chat_stream": {"stream": True, "stream_options": usage},
        "chat_stream_no_usage": {"stream": True},
        "chat_n2": {"n": 2, "temperature": 0.8, "seed": 3},
        "chat_n2_stream": {"n": 2, "stream": True, "stream_options": usage},
        "chat_stop": {"stop": ["e", "\n"]},
        "chat_stop_stream": {"stop": "a", "stream": True, "stream_options": usage},
        "chat_max_completion_tokens": {"max_completion_tokens": 3},
        "chat_sampling": {
            "temperature": 1.2,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.5,
            "seed": 11,
        },
        "chat_tools_auto": {"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "auto"},
        "chat_tools_default": {"tools": [WEATHER_TOOL]},
        "chat_tools_none": {"tools": [WEATHER_TOOL], "tool_choice": "none"},
        "chat_tools_required": {
            "tools": [WEATHER_TOOL, TIME_TOOL],
            "tool_choice": "required",
            "max_tokens": 24,
        },
        "chat_tools_named": {
            "tools": [WEATHER_TOOL, TIME_TOOL],
            "max_tokens": 24,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        "chat_tools_named_stream": {
            "tools": [WEATHER_TOOL],
            "stream": True,
            "stream_options": usage,
            "max_tokens": 24,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        "chat_tools_auto_stream": {
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "stream": True,
            "stream_options": usage,
        },
        "chat_json_object": {"response_format": {"type": "json_object"}},
        "chat_json_schema": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
            },
            "max_tokens": 24,
        },
        "chat_json_schema_stream": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
            },
            "stream": True,
            "stream_options": usage,
            "max_tokens": 24,
        },
        "chat_text_format": {"response_format": {"type": "text"}},
        "chat_guided_choice": {"guided_choice": ["yes", "no", "maybe"]},
    }
    out = [
        Shape(name, CHAT, {"model": model, "messages": msgs, "max_tokens": mt} | extra)
        for name, extra in chat.items()
    ]
    comp: dict[str, dict[str, Any]] = {
        "completion": {},
        "completion_stream": {"stream": True, "stream_options": usage},
        "completion_n2_stream": {"n": 2, "stream": True, "stream_options": usage},
        "completion_echo": {"echo": True},
        "completion_stop": {"stop": [" ", "a"]},
        "completion_ignore_eos": {"ignore_eos": True},
        "completion_guided_regex": {"guided_regex": "[a-z]{1,6}( [a-z]{1,6}){0,3}"},
        "completion_guided_regex_stream": {
            "guided_regex": "[0-9]{3}-[0-9]{4}",
            "stream": True,
            "stream_options": usage,
        },
        "completion_guided_choice": {"guided_choice": ["red", "green", "blue"]},
        "completion_guided_json": {"guided_json": PERSON_SCHEMA, "max_tokens": 24},
        "completion_structured_outputs": {"structured_outputs": {"regex": "(ab)+"}},
        "completion_prompt_list": {"prompt": ["Once upon a time"]},
    }
    out += [
        Shape(name, COMPLETIONS, {"model": model, "prompt": "Once upon", "max_tokens": mt} | extra)
        for name, extra in comp.items()
    ]
    flat_tool = {"type": "function", **WEATHER_TOOL["function"]}
    resp: dict[str, dict[str, Any]] = {
        "responses": {"instructions": "Be brief.", "store": False},
        "responses_stored": {},
        "responses_stream": {"stream": True, "store": False},
        "responses_tools_required": {"tools": [flat_tool], "tool_choice": "required"},
        "responses_tools_stream": {
            "tools": [flat_tool],
            "tool_choice": "auto",
            "stream": True,
            "store": False,
        },
        "responses_json_schema": {
            "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON_SCHEMA}},
            "max_output_tokens": 24,
            "store": False,
        },
        "responses_items": {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "tools": [flat_tool],
            "store": False,
        },
    }
    out += [
        Shape(
            name, RESPONSES, {"model": model, "input": "Tell me", "max_output_tokens": mt} | extra
        )
        for name, extra in resp.items()
    ]
    return out


def tokenizer_shapes(model: str) -> list[Shape]:
    """Valid ``/tokenize`` (a prompt, messages with and without tools, a continued final
    message, no ``model``) and ``/detokenize`` requests (small ids, in every vocabulary)."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me"}]
    tok: dict[str, dict[str, Any]] = {
        "tokenize_prompt": {"prompt": "Once upon a time \u00e9\u4e2d\U0001f600"},
        "tokenize_prompt_strs": {
            "prompt": "Once upon",
            "add_special_tokens": False,
            "return_token_strs": True,
        },
        "tokenize_chat": {"messages": msgs},
        "tokenize_chat_tools": {"messages": msgs, "tools": [WEATHER_TOOL], "tool_choice": "auto"},
        "tokenize_chat_continue": {
            "messages": [*msgs, {"role": "assistant", "content": "Once"}],
            "continue_final_message": True,
        },
    }
    out = [Shape(name, TOKENIZE, {"model": model} | extra) for name, extra in tok.items()]
    out.append(Shape("tokenize_no_model", TOKENIZE, {"prompt": "Once upon"}))
    out.append(Shape("detokenize", DETOKENIZE, {"model": model, "tokens": [10, 20, 30, 40]}))
    return out


def embedding_shapes(model: str) -> list[Shape]:
    """``/v1/embeddings`` requests to an embedding model: valid ones (a string, a list of
    strings, token arrays, one token array, base64, ``user``) and refused ones that only a
    served embedding model can judge (``dimensions`` it does not declare, an input over
    its ``max_model_len``, a token id outside its vocabulary)."""
    shapes: dict[str, dict[str, Any]] = {
        "embeddings_string": {"input": "The quick brown fox jumps over the lazy dog."},
        "embeddings_list": {"input": ["a", "Once upon a time", "\u00fcn\u00ef \U0001f642 \u4e2d"]},
        "embeddings_token_arrays": {"input": [[1000, 2000, 3000], [1500]]},
        "embeddings_token_array": {"input": [1000, 2000, 3000, 4000]},
        "embeddings_base64": {"input": ["hello", "world"], "encoding_format": "base64"},
        "embeddings_user": {"input": "hello", "encoding_format": "float", "user": "soak"},
        "embeddings_dimensions_undeclared": {"input": "hello", "dimensions": 7},
        "embeddings_too_long": {"input": "word " * 5000},
        "embeddings_token_out_of_vocab": {"input": [[10**9]]},
    }
    return [Shape(name, EMBEDDINGS, {"model": model} | body) for name, body in shapes.items()]


def disconnect_shapes(model: str) -> list[Shape]:
    """Streamed requests the client leaves after the first event (long ``max_tokens``
    so that the server is still generating)."""
    usage = {"include_usage": True}
    return [
        Shape(
            "disconnect_chat",
            CHAT,
            {
                "model": model,
                "max_tokens": 64,
                "stream": True,
                "stream_options": usage,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "Go on"}],
            },
            disconnect=True,
        ),
        Shape(
            "disconnect_completion",
            COMPLETIONS,
            {"model": model, "prompt": "Go", "max_tokens": 64, "stream": True, "ignore_eos": True},
            disconnect=True,
        ),
        Shape(
            "disconnect_tools",
            CHAT,
            {
                "model": model,
                "max_tokens": 64,
                "stream": True,
                "tools": [WEATHER_TOOL],
                "tool_choice": "required",
                "messages": [{"role": "user", "content": "Weather?"}],
            },
            disconnect=True,
        ),
    ]


WEIGHTS: dict[str, float] = {
    "valid": 0.43,
    "tokenizer": 0.04,
    "sdk": 0.15,
    "hostile": 0.14,
    "schemas": 0.12,
    "disconnect": 0.07,
    "embeddings": 0.05,
}
"""The share of each category in the traffic (an empty category's share is spread over
the others: ``embeddings`` is empty without an embedding model)."""


@dataclass
class Mix:
    """Draws request shapes by category weight (:data:`WEIGHTS`), deterministic for
    ``seed``. ``schemas`` is how many hypothesis-generated schemas to use;
    ``embed_model``, an embedding model the server serves (the ``embeddings`` category;
    None: no such category, its weight is not drawn)."""

    model: str
    max_tokens: int = 8
    seed: int = 0
    schemas: int = 150
    embed_model: str | None = None
    categories: dict[str, list[Shape]] = field(init=False)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        gen = schema_shapes(self.model, generated_schemas(self.schemas, self.seed))
        self.categories = {
            "valid": valid_shapes(self.model, self.max_tokens),
            "tokenizer": tokenizer_shapes(self.model),
            "sdk": sdk_shapes(self.model),
            "hostile": hostile_shapes(self.model),
            "schemas": gen,
            "disconnect": disconnect_shapes(self.model),
            "embeddings": embedding_shapes(self.embed_model) if self.embed_model else [],
        }

    def counts(self) -> dict[str, int]:
        """How many shapes each category holds."""
        return {k: len(v) for k, v in self.categories.items()}

    def draw(self) -> tuple[str, Shape]:
        """The next ``(category, shape)``."""
        cats = [c for c in WEIGHTS if self.categories.get(c)]
        cat = self.rng.choices(cats, weights=[WEIGHTS[c] for c in cats])[0]
        return cat, self.rng.choice(self.categories[cat])
