"""Speculative decoding end to end (issue 37): a ``servehall serve`` subprocess serves the
demo model twice on ``openvino_cpu``, alone and with a draft model (``draft_model``, here
the demo model itself: the path through config, conversion before the worker starts, the
worker's speculative pipeline and HTTP/2), and greedy completions and chat answers of the
two are identical; ``/metrics`` then shows the speculative-decoding counters
(``servehall_spec_decode_*``, from the worker's heartbeat) for ``demo-spec`` only.
``servehall config check`` reports a missing draft directory in one
line. (Token-level identity with a draft that is partly rejected, sampling, and each
option error: plugins/openvino_cpu/tests/test_ov_speculative.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.plugin.manager import PluginHost, installed_entry_points
from tests.conftest import dump_toml


def _openvino_ready() -> str | None:
    if "openvino_cpu" not in installed_entry_points():
        return "openvino_cpu plugin is not installed"
    result = PluginHost(["openvino_cpu"]).backends().probe("openvino_cpu")
    return None if result.available else f"openvino_cpu unavailable: {result.reason}"


_SKIP = _openvino_ready()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

PROMPTS = ["The cat", "A small robot builds the old house in the morning. The queen", "1 2 3"]


def _config(model_dir: Path, draft: Path | str) -> dict[str, Any]:
    base = {"inference_precision": "f32", "num_kv_blocks": 128}
    return {
        "plugins": {"enabled": ["openvino_cpu"]},
        "models": [
            {"name": "demo", "path": str(model_dir), "backend": "openvino_cpu", "options": base},
            {
                "name": "demo-spec",
                "path": str(model_dir),
                "backend": "openvino_cpu",
                "options": {**base, "draft_model": str(draft), "num_assistant_tokens": 3},
            },
        ],
        "sinks": [],
    }


def test_greedy_answers_with_a_draft_equal_the_models_own(
    servehall_server: Callable[..., Any], demo_model_dir: Path
) -> None:
    with (
        servehall_server(_config(demo_model_dir, demo_model_dir), name="spec") as srv,
        httpx.Client(base_url=srv.base_url, timeout=120, http2=True) as c,
    ):
        answers: dict[str, list[str]] = {}
        for model in ("demo", "demo-spec"):
            texts = []
            for prompt in PROMPTS:
                r = c.post(
                    "/v1/completions",
                    json={"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0},
                )
                assert r.status_code == 200, r.text
                texts.append(r.json()["choices"][0]["text"])
            r = c.post(
                "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "Tell me about the sea."}],
                    "max_tokens": 24,
                    "temperature": 0,
                },
            )
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["message"]["content"])
            answers[model] = texts
        assert answers["demo-spec"] == answers["demo"]
        assert any(answers["demo"])
        counts = _spec_counts(c, "demo-spec")
    drafts, draft_tokens, accepted, per_pos = counts
    assert drafts > 0 and 0 < accepted <= draft_tokens <= 3 * drafts, counts
    # the draft is the model itself: OpenVINO GenAI accepts every draft token that does not
    # run past the end of the answer (its own generate() figure is 100 %); the counts
    # derived from the step API may miss one per request at its end
    assert draft_tokens - accepted <= 3 * (len(PROMPTS) + 1), counts
    assert sum(per_pos.values()) == accepted and set(per_pos) <= {"0", "1", "2"}, counts


def _spec_counts(c: httpx.Client, model: str) -> tuple[float, float, float, dict[str, float]]:
    """The ``servehall_spec_decode_*`` values of ``model`` once the worker's heartbeat
    carried the last request's steps (drafts stop changing; at most 30 s); asserts that the
    plain model has no such series."""
    from prometheus_client.parser import text_string_to_metric_families

    last: tuple[float, float, float, dict[str, float]] | None = None
    deadline = time.monotonic() + 30
    while True:
        values: dict[str, float] = {}
        per_pos: dict[str, float] = {}
        for fam in text_string_to_metric_families(c.get("/metrics").text):
            for sample in fam.samples:
                if not sample.name.startswith("servehall_spec_decode_"):
                    continue
                assert sample.labels["model"] == model, sample
                if sample.name.endswith("_per_pos_total"):
                    per_pos[sample.labels["position"]] = sample.value
                else:
                    values[sample.name] = sample.value
        counts = (
            values.get("servehall_spec_decode_num_drafts_total", 0.0),
            values.get("servehall_spec_decode_num_draft_tokens_total", 0.0),
            values.get("servehall_spec_decode_num_accepted_tokens_total", 0.0),
            per_pos,
        )
        if (last is not None and counts == last and counts[0] > 0) or time.monotonic() > deadline:
            return counts
        last = counts
        time.sleep(0.5)


def test_config_check_names_a_missing_draft(demo_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(dump_toml(_config(demo_model_dir, tmp_path / "no-such-draft")))
    out = subprocess.run(
        [sys.executable, "-c", "from servehall.cli import main; main()", "config", "check", path],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SERVEHALL_CONFIG"},
        timeout=120,
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "models.demo-spec.options.draft_model" in text, text
    assert "no-such-draft is not a directory" in text and "Traceback" not in text, text
