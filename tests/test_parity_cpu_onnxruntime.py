"""Cross-engine parity, end to end over HTTP/2: on the demo model, greedy outputs of the
torch ``cpu`` backend (the reference) and the ONNX Runtime GenAI engine on the CPU
execution provider (``backend = "cpu"``, ``options.engine = "onnxruntime"``, fp32) are
identical for a set of prompts, streamed and not.

Two real ``servehall serve`` subprocesses answer the same greedy requests; we compare
generated text, completion-token counts and finish reasons (identical token ids give
identical text and counts). The same prompts and comparison as the OpenVINO parity test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_parity_cpu_openvino import CHATS, PROMPTS, _outputs

pytest.importorskip("onnxruntime_genai")


def _config(model_dir: Path, engine: str, cache: Path) -> dict[str, Any]:
    options: dict[str, Any] = {"dtype": "float32"}
    if engine == "onnxruntime":
        options = {"engine": "onnxruntime", "precision": "fp32", "cache_dir": str(cache)}
    return {
        "plugins": {"enabled": []},
        "models": [{"name": "demo", "path": str(model_dir), "backend": "cpu", "options": options}],
        "sinks": [],
    }


@pytest.fixture(scope="module")
def servers(
    servehall_server: Callable[..., Any], demo_model_dir: Path, tmp_path_factory: Any
) -> Iterator[dict[str, str]]:
    cache = tmp_path_factory.mktemp("ort-cache")
    cpu = servehall_server(
        _config(demo_model_dir, "torch", cache), name="parity-torch", ready_timeout=600
    )
    # the ONNX model is built at start (~2 minutes on a loaded 2-core machine)
    ort = servehall_server(
        _config(demo_model_dir, "onnxruntime", cache), name="parity-ort", ready_timeout=600
    )
    try:
        yield {"torch": cpu.base_url, "onnxruntime": ort.base_url}
    finally:
        cpu.stop()
        ort.stop()


async def test_parity_torch_vs_onnxruntime_greedy_f32(servers: dict[str, str]) -> None:
    reference = await _outputs(servers["torch"])
    candidate = await _outputs(servers["onnxruntime"])
    assert any(n > 3 for _, n, _ in reference), "reference produced (almost) nothing"
    for prompt, ref, got in zip([*PROMPTS, *map(str, CHATS)], reference, candidate, strict=True):
        assert got == ref, f"engines disagree on {prompt!r}: torch={ref!r} onnxruntime={got!r}"


async def test_onnxruntime_streaming_equals_non_streaming(servers: dict[str, str]) -> None:
    async with httpx.AsyncClient(
        http1=False, http2=True, base_url=servers["onnxruntime"], timeout=120
    ) as client:
        body = {"model": "demo", "prompt": PROMPTS[2], "max_tokens": 24, "temperature": 0}
        whole = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        parts: list[str] = []
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    parts.extend(c.get("text", "") for c in json.loads(line[6:])["choices"])
        assert "".join(parts) == whole


async def test_onnxruntime_refuses_what_it_cannot_do(servers: dict[str, str]) -> None:
    """Penalties have no ONNX Runtime equivalent: 400 naming the field, never ignored."""
    async with httpx.AsyncClient(
        http1=False, http2=True, base_url=servers["onnxruntime"], timeout=120
    ) as client:
        r = await client.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "Hi", "max_tokens": 4, "presence_penalty": 1.0},
        )
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "presence_penalty"
        r = await client.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "Hi", "max_tokens": 4, "min_p": 0.5},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "min_p"
        r = await client.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "Hi", "max_tokens": 4, "top_k": 5},
        )
        assert r.status_code == 200, r.text  # top_k is honoured
        info = (await client.get("/v1/models")).json()
        assert [m["id"] for m in info["data"]] == ["demo"]


async def test_ignore_eos_runs_both_engines_to_max_tokens(servers: dict[str, str]) -> None:
    """``ignore_eos`` (the benchmarks' workload) drops the model's EOS ids from the stop
    set on every engine: a prompt whose greedy continuation ends with EOS after a few
    tokens runs to ``max_tokens`` instead (the torch engine used to stop at EOS anyway,
    because the EOS ids also travelled as stop token ids)."""
    body = {"model": "demo", "prompt": "Hello", "max_tokens": 48, "temperature": 0}
    for engine, url in servers.items():
        async with httpx.AsyncClient(http1=False, http2=True, base_url=url, timeout=120) as c:
            control = (await c.post("/v1/completions", json=body)).json()
            forced = (await c.post("/v1/completions", json={**body, "ignore_eos": True})).json()
        assert control["choices"][0]["finish_reason"] == "stop", (engine, control)
        assert control["usage"]["completion_tokens"] < 48, (engine, control)
        assert forced["choices"][0]["finish_reason"] == "length", (engine, forced)
        assert forced["usage"]["completion_tokens"] == 48, (engine, forced)


async def test_onnxruntime_structured_output_via_guidance(servers: dict[str, str]) -> None:
    """``TurnOptions.set_guidance`` (llguidance in ONNX Runtime GenAI 0.18): a JSON Schema
    (numbers without bounds included) validates and stops within 64 tokens, a regex is
    matched; an EBNF grammar, which its guidance cannot take, is a 400 naming the field,
    streamed or not."""
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "c": {"enum": ["red", "blue"]}},
        "required": ["n", "c"],
    }
    async with httpx.AsyncClient(
        http1=False, http2=True, base_url=servers["onnxruntime"], timeout=120
    ) as client:
        for _ in range(2):
            body = {
                "model": "demo",
                "messages": [{"role": "user", "content": "JSON please"}],
                "max_tokens": 64,
                "temperature": 1.0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": schema},
                },
            }
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        r = await client.post(
            "/v1/chat/completions",
            json={
                "model": "demo",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 16,
                "guided_regex": "[a-c]{2,4}-[0-9]",
            },
        )
        assert r.status_code == 200, r.text
        assert re.fullmatch("[a-c]{2,4}-[0-9]", r.json()["choices"][0]["message"]["content"])
        for stream in (False, True):
            bad = {
                "model": "demo",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 8,
                "stream": stream,
                "guided_grammar": 'root ::= "a"',
            }
            r = await client.post("/v1/chat/completions", json=bad)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "guided_grammar"
