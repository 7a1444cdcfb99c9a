"""The conformance kit on the vLLM engine (``backend = "cpu"``, ``options.engine =
"vllm"``, vLLM's CPU build) on the demo model, in a worker under the ``.venv-vllm``
interpreter (``worker.python``): vLLM cannot be imported in this test environment, so only
the ``process`` mode runs. The tests that need only a running engine share one start
(``share_engine``: a vLLM start takes ~90 s on an idle 2-core machine); start/stop and the
dead engine start their own. Plus structured output set directly on the engine (a
``choice`` constraint through the worker to vLLM's ``StructuredOutputsParams``).
Without ``.venv-vllm`` the module skips (fails under ``CI=true``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.engines.backends import BackendSpec
from servehall.engines.contract import SamplingParams, StructuredConstraint
from servehall.plugin.manager import PluginHost
from servehall.testing.conformance import (
    BackendConformance,
    EngineFactory,
    WorkerModel,
    collect,
    tokens_of,
)
from servehall.testing.vllm_env import vllm_python

OPTIONS: dict[str, Any] = {
    "engine": "vllm",
    "kv_cache_space_gib": 1,
    "max_num_seqs": 8,
    "enforce_eager": True,  # no torch.compile at start: minutes on a loaded machine
}


@pytest.fixture(scope="module")
def demo_model() -> Path:
    from servehall.demo import build_demo_model, default_demo_dir

    return Path(build_demo_model(default_demo_dir()))


class TestVllmCpuConformance(BackendConformance):
    _model_path: Path
    share_engine = True
    timeout_s = 900.0  # a vLLM start on a loaded 2-core machine
    long_tokens = 120

    @pytest.fixture(params=["process"])
    def conformance_isolation(self, request: pytest.FixtureRequest) -> str:
        """vLLM runs only in its own environment: process mode (worker.python)."""
        return str(request.param)

    @pytest.fixture
    def conformance_engine_factory(self) -> EngineFactory:
        """Not used: there is no thread mode here."""

        def refuse() -> Any:
            raise AssertionError("the vLLM conformance runs in process mode only")

        return refuse

    @pytest.fixture
    def conformance_worker_model(self, demo_model: Path) -> WorkerModel:
        model = ModelConfig(
            name="demo",
            path=demo_model,
            backend="cpu",
            max_model_len=512,
            options=dict(OPTIONS),
            # vLLM's frontend (input processing, grammar validation) can keep the GIL from
            # the worker's heartbeat thread for over 1 s on a loaded 2-core machine
            worker=WorkerSettings(python=vllm_python(), heartbeat_timeout_s=10.0),
        )
        return (), model

    @pytest.fixture
    def conformance_backend_spec(self) -> BackendSpec:
        return PluginHost([]).backends().get("cpu")

    async def test_structured_choice_reaches_vllm(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            assert "structured_output" in engine.supported_params
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self._model_path / "tokenizer.json"))
            choices = ("yes", "no")
            params = SamplingParams(
                max_tokens=8,
                temperature=0.0,
                structured=StructuredConstraint(choice=choices),
            )
            prompt = tok.encode("Is the sea blue?").ids or [5]
            deltas = await collect(engine.add_request("so-1", prompt, params), self.timeout_s)
            text = tok.decode(tokens_of(deltas), skip_special_tokens=True)
            assert text in choices, (text, deltas)
            assert deltas[-1].finish_reason == "stop"
            schema = {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            }
            params = SamplingParams(
                max_tokens=40,
                temperature=0.0,
                structured=StructuredConstraint(json_schema=json.dumps(schema)),
            )
            deltas = await collect(engine.add_request("so-2", prompt, params), self.timeout_s)
            out = tok.decode(tokens_of(deltas), skip_special_tokens=True)
            if deltas[-1].finish_reason == "stop":
                assert isinstance(json.loads(out)["a"], int), out
            else:  # a random model may not close the object in 40 tokens: a valid prefix
                assert out.lstrip().startswith("{"), out

    @pytest.fixture(autouse=True)
    def _keep_model_path(self, demo_model: Path) -> None:
        type(self)._model_path = demo_model
