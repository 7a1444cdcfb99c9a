"""The openai SDK (requirements/frameworks/openai_sdk.txt) against a servehall server.

Run with ``.venv-frameworks/openai_sdk/bin/python`` (tests/test_frameworks_e2e.py does):
``openai_sdk_run.py BASE_URL MODEL --embed-model NAME`` where BASE_URL ends in ``/v1``.
Prints one JSON object, a result per case (see :mod:`_common`).
"""

from __future__ import annotations

from typing import Any

import openai
from _common import Trip, http_client, main


def client_for(base_url: str) -> tuple[openai.OpenAI, list[str]]:
    """A client that records its requests (:func:`_common.http_client`)."""
    http, requests = http_client()
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    return client, requests


def responses_create(base_url: str, model: str) -> dict[str, Any]:
    """``responses.create``: a text answer (temperature 0 here and below: the same answer
    each run)."""
    client, requests = client_for(base_url)
    r = client.responses.create(
        model=model, input="Say hello.", max_output_tokens=32, temperature=0
    )
    return {
        "id": r.id,
        "status": r.status,
        "output_text": r.output_text,
        "output_tokens": r.usage.output_tokens if r.usage else None,
        "requests": requests,
    }


def responses_stream(base_url: str, model: str) -> dict[str, Any]:
    """``responses.stream``: the SDK's event parser, its text deltas and final response."""
    client, requests = client_for(base_url)
    deltas: list[str] = []
    types: list[str] = []
    with client.responses.stream(
        model=model, input="Say hello.", max_output_tokens=32, temperature=0
    ) as s:
        for event in s:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    return {
        "status": final.status,
        "output_text": final.output_text,
        "deltas_text": "".join(deltas),
        "first_event": types[0] if types else None,
        "last_event": types[-1] if types else None,
        "requests": requests,
    }


def chat_parse(base_url: str, model: str) -> dict[str, Any]:
    """``chat.completions.parse(response_format=Trip)``: the SDK's strict json_schema and its
    own parse into the pydantic model. temperature 0: the demo model's sampled answers parse
    19 times in 20, not always."""
    client, requests = client_for(base_url)
    r = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Plan a trip: a city and a number of days."}],
        response_format=Trip,
        max_completion_tokens=64,
        temperature=0,
    )
    message = r.choices[0].message
    parsed = message.parsed
    return {
        "finish_reason": r.choices[0].finish_reason,
        "trip": parsed.model_dump() if isinstance(parsed, Trip) else None,
        "content": message.content,
        "requests": requests,
    }


def embeddings_create(base_url: str, model: str) -> dict[str, Any]:
    """``embeddings.create`` with the SDK's defaults (it asks for base64 and decodes it)."""
    client, requests = client_for(base_url)
    r = client.embeddings.create(model=model, input=["hello world", "servehall"])
    return {
        "count": len(r.data),
        "dims": [len(d.embedding) for d in r.data],
        "prompt_tokens": r.usage.prompt_tokens,
        "requests": requests,
    }


if __name__ == "__main__":
    main(
        {
            "responses_create": responses_create,
            "responses_stream": responses_stream,
            "chat_parse": chat_parse,
            "embeddings_create": embeddings_create,
        },
        embed_cases=frozenset({"embeddings_create"}),
    )
