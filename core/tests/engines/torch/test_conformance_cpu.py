"""The backend conformance suite on the ``cpu`` torch backend (tiny random Llama)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from servehall.testing.conformance import TinyLlamaConformance

pytest.importorskip("torch")


class TestCpuConformance(TinyLlamaConformance):
    backend = "cpu"
    model_options: ClassVar[dict[str, Any]] = {
        "kv_cache_blocks": 96,
        "block_size": 16,
        "max_batch_tokens": 128,
    }

    @pytest.fixture
    def conformance_crash(self) -> Any:
        def crash(engine: Any) -> None:
            # a device fault in the middle of a step: the next forward pass raises
            def broken_forward(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("simulated device fault")

            engine._model.forward = broken_forward

        return crash
