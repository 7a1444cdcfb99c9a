"""What every ``tests/frameworks/<name>_run.py`` shares. Imported by those scripts only,
each under its own framework's interpreter (``.venv-frameworks/<name>``): nothing here may
import servehall or anything that venv lacks (each framework brings pydantic and the
openai SDK, which it drives).

``main(cases, embed_cases)`` runs ``python <name>_run.py BASE_URL MODEL [--embed-model
NAME] [CASE...]``: each case (a function ``(base_url, model) -> dict``; the cases named in
``embed_cases`` get the embedding model) runs in turn, and one JSON object is printed on the
last line of stdout: ``{case: {"ok": true, ...what it returned} | {"ok": false, "error":
"Type: message", "traceback": "..."}}``. A case that raises does not stop the others.
"""

from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable
from typing import Any

import openai
from pydantic import BaseModel


class Trip(BaseModel):
    """The structured output every framework is asked for: two fields, no bounds."""

    city: str
    days: int


WEATHER_SEEN: list[str] = []
"""The ``city`` of every ``get_weather`` call an agent made (the scripts' tools append)."""


def weather(city: str) -> str:
    """The tools' body: record the call, answer something an agent can use."""
    WEATHER_SEEN.append(city)
    return f"It is sunny and 21 C in {city}."


def http_client(asynchronous: bool = False) -> tuple[Any, list[str]]:
    """An httpx client for the openai SDK that records ``"METHOD /path"`` of each request
    it sends (how many requests a run took: a parse that needed a retry shows), and that
    list."""
    seen: list[str] = []

    def record(request: Any) -> None:
        seen.append(f"{request.method} {request.url.path}")

    async def arecord(request: Any) -> None:
        record(request)

    # the SDK's own client class: openai 3 is built on httpx2, older ones on httpx
    if asynchronous:
        return openai.DefaultAsyncHttpxClient(timeout=120, event_hooks={"request": [arecord]}), seen
    return openai.DefaultHttpxClient(timeout=120, event_hooks={"request": [record]}), seen


def main(
    cases: dict[str, Callable[..., dict[str, Any]]], embed_cases: frozenset[str] = frozenset()
) -> None:
    """Run the cases named on the command line (all by default); print the JSON result."""
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url", help="the server's OpenAI base URL, ending in /v1")
    parser.add_argument("model", help="the chat model")
    parser.add_argument("--embed-model", default="", help="the embedding model")
    parser.add_argument("cases", nargs="*", choices=[[], *cases], help="default: all")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for name in args.cases or list(cases):
        WEATHER_SEEN.clear()
        model = args.embed_model if name in embed_cases else args.model
        try:
            out[name] = {"ok": True, **cases[name](args.base_url, model)}
        except Exception as exc:  # every failure is reported, as data
            out[name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:4000],
                "traceback": traceback.format_exc()[-6000:],
            }
    print(json.dumps(out, default=str))
