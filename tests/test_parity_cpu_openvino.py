"""Cross-backend parity, end to end over HTTP/2: on the demo model, greedy outputs of the
torch ``cpu`` backend (the reference) and ``openvino_cpu`` at ``inference_precision = f32``
are identical for a set of prompts.

Two real ``servehall serve`` subprocesses (shared ``servehall_server`` fixture), one per
backend, answer the same greedy requests; we compare the generated text, the number of
completion tokens and the finish reason of every prompt (identical token ids give
identical text and counts; the API does not return token ids). Skipped, with the reason,
when the ``openvino_cpu`` plugin is not installed or its probe fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.plugin.manager import PluginHost, installed_entry_points

PROMPTS = [
    "Hello",
    "The cat sat on",
    "Once upon a time, the old house",
    "Write about the sea and the river.",
    "1 2 3 4 5",
    "The last train",
]
CHATS = [
    [{"role": "user", "content": "hi there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about the sea."},
    ],
]
MAX_TOKENS = 24


def _openvino_ready() -> str | None:
    if "openvino_cpu" not in installed_entry_points():
        return "openvino_cpu plugin is not installed"
    try:
        reg = PluginHost(["openvino_cpu"]).backends()
        result = reg.probe("openvino_cpu")
    except Exception as exc:  # plugin fails to load: report, do not error the suite
        return f"openvino_cpu plugin failed to load: {exc}"
    return None if result.available else f"openvino_cpu unavailable: {result.reason}"


_SKIP = _openvino_ready()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _config(model_dir: Path, backend: str) -> dict[str, Any]:
    options: dict[str, Any] = (
        {"inference_precision": "f32"} if backend == "openvino_cpu" else {"dtype": "float32"}
    )
    return {
        "plugins": {"enabled": ["openvino_cpu"] if backend == "openvino_cpu" else []},
        "models": [
            {"name": "demo", "path": str(model_dir), "backend": backend, "options": options}
        ],
        "sinks": [],
    }


@pytest.fixture(scope="module")
def servers(servehall_server: Callable[..., Any], demo_model_dir: Path) -> Iterator[dict[str, str]]:
    cpu = servehall_server(_config(demo_model_dir, "cpu"), name="parity-cpu")
    ov = servehall_server(_config(demo_model_dir, "openvino_cpu"), name="parity-ov")
    try:
        yield {"cpu": cpu.base_url, "openvino_cpu": ov.base_url}
    finally:
        cpu.stop()
        ov.stop()


async def _outputs(base_url: str) -> list[tuple[str, int, str]]:
    async with httpx.AsyncClient(http1=False, http2=True, base_url=base_url, timeout=120) as client:
        reqs = [
            client.post(
                "/v1/completions",
                json={"model": "demo", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0},
            )
            for p in PROMPTS
        ] + [
            client.post(
                "/v1/chat/completions",
                json={"model": "demo", "messages": m, "max_tokens": MAX_TOKENS, "temperature": 0},
            )
            for m in CHATS
        ]
        responses = await asyncio.gather(*reqs)
        assert all(r.http_version == "HTTP/2" for r in responses)
        out = []
        for r in responses:
            assert r.status_code == 200, r.text
            body = r.json()
            choice = body["choices"][0]
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            out.append((text, body["usage"]["completion_tokens"], choice["finish_reason"]))
        return out


async def test_parity_cpu_vs_openvino_cpu_greedy_f32(servers: dict[str, str]) -> None:
    reference = await _outputs(servers["cpu"])
    candidate = await _outputs(servers["openvino_cpu"])
    assert any(n > 3 for _, n, _ in reference), "reference produced (almost) nothing"
    for prompt, ref, got in zip([*PROMPTS, *map(str, CHATS)], reference, candidate, strict=True):
        assert got == ref, f"backends disagree on {prompt!r}: cpu={ref!r} openvino_cpu={got!r}"


async def test_parity_cpu_streaming_equals_non_streaming(servers: dict[str, str]) -> None:
    """The reference itself: streamed deltas concatenate to the non-streamed text."""
    async with httpx.AsyncClient(
        http1=False, http2=True, base_url=servers["cpu"], timeout=120
    ) as client:
        body = {"model": "demo", "prompt": PROMPTS[2], "max_tokens": MAX_TOKENS, "temperature": 0}
        whole = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        parts: list[str] = []
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    import json

                    parts.extend(c.get("text", "") for c in json.loads(line[6:])["choices"])
        assert "".join(parts) == whole
