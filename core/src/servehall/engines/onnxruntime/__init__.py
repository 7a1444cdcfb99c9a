"""The shared ONNX Runtime GenAI engine (extra ``servehall[onnxruntime]``).

Any backend can offer it through :func:`servehall.engines.select.engine_factory`
(``[[models]] options.engine = "onnxruntime"``): the core's ``cpu`` backend runs it on the
CPU execution provider, the ``cuda`` plugin on the CUDA execution provider. Importing this
package is cheap: onnxruntime loads only when an engine starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servehall.engines.lazy import lazy_names
from servehall.engines.onnxruntime.build import is_onnx_genai_dir, resolve_onnx_dir
from servehall.engines.onnxruntime.options import OrtOptions, OrtProvider, parse_ort_options
from servehall.engines.onnxruntime.probe import cpu_provider_status, cuda_provider_status

if TYPE_CHECKING:
    from servehall.engines.onnxruntime.engine import OnnxRuntimeEngine

__all__ = [
    "OnnxRuntimeEngine",
    "OrtOptions",
    "OrtProvider",
    "cpu_provider_status",
    "cuda_provider_status",
    "is_onnx_genai_dir",
    "parse_ort_options",
    "resolve_onnx_dir",
]


__getattr__ = lazy_names(__name__, {"OnnxRuntimeEngine": "servehall.engines.onnxruntime.engine"})
