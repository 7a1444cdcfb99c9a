"""openai-agents (requirements/frameworks/openai_agents.txt) against a servehall server.

Run with ``.venv-frameworks/openai_agents/bin/python`` (tests/test_frameworks_e2e.py
does): ``openai_agents_run.py BASE_URL MODEL`` where BASE_URL ends in ``/v1``. Prints one
JSON object, a result per case (see :mod:`_common`).
"""

from __future__ import annotations

from typing import Any

from _common import WEATHER_SEEN, http_client, main, weather
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no trace export to OpenAI

QUESTION = "What is the weather in Paris?"
SETTINGS = ModelSettings(temperature=0, max_tokens=128)
"""temperature 0 (greedy): the demo model's likeliest answer, not a sample of it."""


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return weather(city)


def _run(agent: Agent[Any], requests: list[str]) -> dict[str, Any]:
    result = Runner.run_sync(agent, QUESTION, max_turns=4)
    return {
        "tool_calls": list(WEATHER_SEEN),
        "final_output": result.final_output,
        "requests": requests,
    }


def responses_model(base_url: str, model: str) -> dict[str, Any]:
    """The default model: ``Agent(model="demo")`` with the default client is
    ``OpenAIResponsesModel``, on ``/v1/responses``."""
    http, requests = http_client(asynchronous=True)
    set_default_openai_client(
        AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http),
        use_for_tracing=False,
    )
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        model=model,
        tools=[get_weather],
        model_settings=SETTINGS,
    )
    return _run(agent, requests)


def chat_completions_model(base_url: str, model: str) -> dict[str, Any]:
    """``OpenAIChatCompletionsModel``, on ``/v1/chat/completions``."""
    http, requests = http_client(asynchronous=True)
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[get_weather],
        model_settings=SETTINGS,
    )
    return _run(agent, requests)


if __name__ == "__main__":
    main({"responses_model": responses_model, "chat_completions_model": chat_completions_model})
