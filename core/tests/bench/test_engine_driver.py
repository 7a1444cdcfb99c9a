"""Tests of servehall.bench.engine_driver on a real engine: the ``null`` backend (it
streams tokens without a model) on a locally built tokenizer. Prompt ids as the API
tokenizes them, one request timed per delta, and the unknown-model and bad-tokenizer
errors."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.bench.client import TargetError
from servehall.bench.engine_driver import loaded_engine, send_to_engine
from servehall.bench.workload import BenchRequest


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("drv")
    tok = build_tokenizer(root / "tok")
    cfg = root / "c.toml"
    cfg.write_text(
        f'[[models]]\nname = "m"\npath = "{tok}"\nbackend = "null"\n\n'
        f'[[models]]\nname = "nodir"\npath = "{root / "none"}"\nbackend = "null"\n'
    )
    return cfg


async def test_one_request_is_timed_per_delta(config: Path) -> None:
    async with loaded_engine(config, "m") as loaded:
        assert (loaded.name, loaded.backend) == ("m", "null")
        req = BenchRequest("the quick brown fox", 4, 5)
        chat = loaded.prompt_ids(req, "chat")
        plain = loaded.prompt_ids(req, "completions")
        assert chat != plain  # the chat template for chat, plain text for completions
        assert plain == loaded.tokenizer.encode_plain(req.prompt, add_special_tokens=True)
        t0 = time.perf_counter()
        out = await send_to_engine(loaded, req, t0)
        assert out.success and out.error == ""
        assert out.output_tokens == 5 and out.prompt_tokens == len(chat)
        assert 0 < out.ttft <= out.latency
        assert len(out.token_times) == len(out.itl) + 1
        assert out.token_times == sorted(out.token_times)
        assert out.start >= 0


async def test_unknown_model_and_a_missing_tokenizer(config: Path) -> None:
    with pytest.raises(TargetError, match=r"model 'x' is not in the config's \[\[models\]\]"):
        async with loaded_engine(config, "x"):
            pass
    with pytest.raises(TargetError, match="cannot load the tokenizer"):
        async with loaded_engine(config, "nodir"):
            pass
