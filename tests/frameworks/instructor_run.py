"""instructor (requirements/frameworks/instructor.txt) against a servehall server.

Run with ``.venv-frameworks/instructor/bin/python`` (tests/test_frameworks_e2e.py does):
``instructor_run.py BASE_URL MODEL`` where BASE_URL ends in ``/v1``. Prints one JSON
object, a result per case (see :mod:`_common`).
"""

from __future__ import annotations

from typing import Any

import instructor
import openai
from _common import Trip, http_client, main
from pydantic import BaseModel

PROMPT = "Plan a trip: a city and a number of days."


def _trip(base_url: str, model: str, mode: instructor.Mode) -> dict[str, Any]:
    http, requests = http_client()
    client = instructor.from_openai(
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http),
        mode=mode,
    )
    # max_retries=0: one request, no re-ask; the Trip must parse the first time.
    # temperature 0: the demo model's sampled answers parse 19 times in 20, not always
    trip = client.chat.completions.create(
        model=model,
        response_model=Trip,
        messages=[{"role": "user", "content": PROMPT}],
        max_retries=0,
        max_tokens=64,
        temperature=0,
    )
    assert isinstance(trip, BaseModel)
    return {"trip": trip.model_dump(), "requests": requests}


def tools(base_url: str, model: str) -> dict[str, Any]:
    """``Mode.TOOLS`` (instructor's default): the Trip comes back as a forced tool call."""
    return _trip(base_url, model, instructor.Mode.TOOLS)


def json_schema(base_url: str, model: str) -> dict[str, Any]:
    """``Mode.JSON_SCHEMA``: ``response_format`` json_schema."""
    return _trip(base_url, model, instructor.Mode.JSON_SCHEMA)


if __name__ == "__main__":
    main({"tools": tools, "json_schema": json_schema})
