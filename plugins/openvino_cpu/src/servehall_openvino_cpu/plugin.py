"""Entry module of the ``openvino_cpu`` plugin (import-light: OpenVINO loads lazily).

Registers the backend ``openvino_cpu``: OpenVINO GenAI continuous batching on x86 CPUs
(``task = "generate"``), and OpenVINO encoder inference for ``task = "embed"``.
``auto_priority`` 50 puts it above the core's torch ``cpu`` backend and below
accelerators (>= 100).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servehall import BackendRegistry, BackendSpec, hookimpl
from servehall_openvino_cpu.probe import probe

if TYPE_CHECKING:
    from servehall import ModelConfig
    from servehall_openvino_cpu.embedding import OpenVINOEmbeddingEngine
    from servehall_openvino_cpu.engine import OpenVINOEngine

SERVEHALL_HOOK_API = "2"


def factory(model: ModelConfig) -> OpenVINOEngine | OpenVINOEmbeddingEngine:
    """Build an unstarted :class:`~servehall_openvino_cpu.engine.OpenVINOEngine`, or for
    ``task = "embed"`` an :class:`~servehall_openvino_cpu.embedding.OpenVINOEmbeddingEngine`
    (validates options; raises ConfigError)."""
    if model.task == "embed":
        from servehall_openvino_cpu.embedding import OpenVINOEmbeddingEngine

        return OpenVINOEmbeddingEngine(model)
    from servehall_openvino_cpu.engine import OpenVINOEngine

    return OpenVINOEngine(model)


def prepare(model: ModelConfig) -> None:
    """Convert a Hugging Face model directory (and a ``draft_model``'s) to OpenVINO IR
    (cached) before the worker starts, so the worker's start window only covers loading
    (raises ConfigError / EngineError). An embedding model (``task = "embed"``) is
    exported with ``feature-extraction``."""
    from pathlib import Path

    from servehall_openvino_cpu.convert import resolve_ir_dir
    from servehall_openvino_cpu.options import parse_options

    if model.task == "embed":
        from servehall_openvino_cpu.embedding import OpenVINOEmbeddingEngine

        OpenVINOEmbeddingEngine(model).resolve()
        return
    opts = parse_options(model.options, model=model.name)
    paths = [Path(model.path).expanduser()]
    if opts.draft_model is not None:
        paths.append(opts.draft_model)
    for path in paths:
        resolve_ir_dir(
            path,
            cache_dir=opts.cache_dir,
            weight_format=opts.weight_format,
            group_size=opts.weight_group_size,
            ratio=opts.weight_ratio,
        )


def check_options(model: ModelConfig) -> None:
    """Validate the model's ``options`` (config load and ``servehall config check``);
    raises ConfigError naming each bad ``models.<name>.options.<key>``."""
    from servehall_openvino_cpu.options import parse_options

    opts = parse_options(model.options, model=model.name)
    if model.task == "embed":
        from servehall_openvino_cpu.embedding import check_embed_options

        check_embed_options(opts, model.name)


SPEC = BackendSpec(
    name="openvino_cpu",
    probe=probe,
    factory=factory,
    prepare=prepare,
    check_options=check_options,
    auto_priority=50,
    description="x86 CPUs through OpenVINO GenAI continuous batching (paged KV cache); "
    "embedding models through OpenVINO",
)


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    """Add the ``openvino_cpu`` backend."""
    registry.add(SPEC)
