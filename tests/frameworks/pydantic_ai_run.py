"""pydantic-ai (requirements/frameworks/pydantic_ai.txt) against a servehall server.

Run with ``.venv-frameworks/pydantic_ai/bin/python`` (tests/test_frameworks_e2e.py does):
``pydantic_ai_run.py BASE_URL MODEL`` where BASE_URL ends in ``/v1``. Prints one JSON
object, a result per case (see :mod:`_common`).
"""

from __future__ import annotations

from typing import Any

from _common import Trip, http_client, main
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


def output_type(base_url: str, model: str) -> dict[str, Any]:
    """``Agent(output_type=Trip)``: pydantic-ai's default output mode (a ``final_result``
    tool the model must call) parses into a Trip. ``retries=0``: no second request when it
    does not validate. temperature 0: the demo model's sampled answers parse 19 times in
    20, not always."""
    http, requests = http_client(asynchronous=True)
    agent = Agent(
        OpenAIChatModel(
            model, provider=OpenAIProvider(base_url=base_url, api_key="unused", http_client=http)
        ),
        output_type=Trip,
        retries=0,
        model_settings={"temperature": 0, "max_tokens": 64},
    )
    result = agent.run_sync("Plan a trip: a city and a number of days.")
    trip = result.output
    return {"trip": trip.model_dump() if isinstance(trip, Trip) else None, "requests": requests}


if __name__ == "__main__":
    main({"output_type": output_type})
