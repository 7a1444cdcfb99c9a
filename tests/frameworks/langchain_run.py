"""langchain-openai (requirements/frameworks/langchain.txt) against a servehall server.

Run with ``.venv-frameworks/langchain/bin/python`` (tests/test_frameworks_e2e.py does):
``langchain_run.py BASE_URL MODEL --embed-model NAME`` where BASE_URL ends in ``/v1``.
Prints one JSON object, a result per case (see :mod:`_common`).
"""

from __future__ import annotations

from typing import Any

from _common import Trip, http_client, main, weather
from langchain_openai import ChatOpenAI, OpenAIEmbeddings


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return weather(city)


def chat(base_url: str, model: str) -> tuple[ChatOpenAI, list[str]]:
    """``ChatOpenAI`` on the server. temperature 0: the demo model's sampled answers parse
    19 times in 20, not always."""
    http, requests = http_client()
    llm = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key="unused",  # type: ignore[arg-type]
        max_retries=0,
        temperature=0,
        max_completion_tokens=64,
        http_client=http,
    )
    return llm, requests


def structured_output(base_url: str, model: str) -> dict[str, Any]:
    """``with_structured_output(Trip, method="json_schema")``: a parsed Trip."""
    llm, requests = chat(base_url, model)
    trip = llm.with_structured_output(Trip, method="json_schema").invoke(
        "Plan a trip: a city and a number of days."
    )
    return {
        "trip": trip.model_dump() if isinstance(trip, Trip) else None,
        "type": type(trip).__name__,
        "requests": requests,
    }


def bind_tools_required(base_url: str, model: str) -> dict[str, Any]:
    """``bind_tools([get_weather], tool_choice="required")``: one tool call, its args parsed.

    ``parallel_tool_calls=False``: allowed several calls, the demo model at temperature 0
    calls get_weather again and again until ``max_completion_tokens`` cuts the last one
    (finish_reason ``length``; measured 2026-12-03)."""
    llm, requests = chat(base_url, model)
    message = llm.bind_tools(
        [get_weather], tool_choice="required", parallel_tool_calls=False
    ).invoke("What is the weather in Paris?")
    return {
        "tool_calls": [{"name": c["name"], "args": c["args"]} for c in message.tool_calls],
        "invalid_tool_calls": [dict(c) for c in message.invalid_tool_calls],
        "requests": requests,
    }


def embeddings(base_url: str, model: str) -> dict[str, Any]:
    """``OpenAIEmbeddings``: ``embed_documents`` and ``embed_query``.

    ``check_embedding_ctx_length=False``: by default the client splits texts with tiktoken,
    whose encodings it downloads from OpenAI (and whose token ids mean nothing to another
    model); langchain's documented setting for OpenAI-compatible servers sends the text."""
    http, requests = http_client()
    emb = OpenAIEmbeddings(
        model=model,
        base_url=base_url,
        api_key="unused",  # type: ignore[arg-type]
        max_retries=0,
        check_embedding_ctx_length=False,
        http_client=http,
    )
    docs = emb.embed_documents(["hello world", "servehall"])
    query = emb.embed_query("hello world")
    return {"dims": [len(v) for v in docs], "query_dims": len(query), "requests": requests}


if __name__ == "__main__":
    main(
        {
            "structured_output": structured_output,
            "bind_tools_required": bind_tools_required,
            "embeddings": embeddings,
        },
        embed_cases=frozenset({"embeddings"}),
    )
