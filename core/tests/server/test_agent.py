"""The HAProxy agent endpoint (:mod:`servehall.server.agent`): a real TCP listener
answering HAProxy's agent-check protocol — ``down`` before any model is ready, ``up ready
W%`` with the weight falling as requests occupy the replica, ``drain`` while draining."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.engines.contract import SamplingParams
from servehall.server.agent import AgentServer, agent_weight
from servehall.serving.probe import Readiness
from servehall.text import load_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


async def _ask(port: int) -> str:
    """One agent check, as HAProxy does it: connect, read a line, close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return line.decode("ascii")


async def test_agent_answers_down_weight_and_drain(tok_dir: Path) -> None:
    script = load_tokenizer(tok_dir).encode_plain(" the quick brown fox")
    engine = ScriptedEngine(script, step_s=60.0)  # requests stay running
    host = make_host(tok_dir, engine, settings={"scheduler": {"max_concurrency": 4}})
    readiness = Readiness(host)
    draining = False
    agent = AgentServer(host, readiness, lambda: draining, "127.0.0.1:0")
    await agent.start()
    try:
        assert await _ask(agent.port) == "down\n"  # no successful probe yet
        readiness.mark_ok("m")
        assert await _ask(agent.port) == "up ready 100%\n"
        # two of four slots busy (ScriptedEngine: one KV block per live request of 64)
        streams = [
            engine.add_request(f"r{i}", [1, 2], SamplingParams(max_tokens=8)) for i in range(2)
        ]
        assert agent_weight(host) == 50
        assert await _ask(agent.port) == "up ready 50%\n"
        streams += [
            engine.add_request(f"r{i}", [1, 2], SamplingParams(max_tokens=8)) for i in (2, 3, 4)
        ]
        assert await _ask(agent.port) == "up ready 1%\n"  # full, never 0 (= drain)
        draining = True
        assert await _ask(agent.port) == "drain\n"
        for i in range(5):
            await engine.abort(f"r{i}")
    finally:
        await agent.close()
