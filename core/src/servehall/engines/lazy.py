"""Names a package exports but imports only on first access (PEP 562 ``__getattr__``).

The engine packages (``servehall.engines.torch``, ``.onnxruntime``, ``.vllm``) and the
public face :mod:`servehall.devices` stay cheap to import: the engine classes, which pull
in torch, ONNX Runtime or vLLM, load when a caller first reads them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``module`` (its ``__name__``): a name in
    ``names`` (name → the module that defines it) is imported from there on first access
    (Python then finds it through this function on each access; the import itself is
    cached in ``sys.modules``); any other name raises ``AttributeError``.

    Use: ``__getattr__ = lazy_names(__name__, {"TorchEngine":
    "servehall.engines.torch.engine"})``, with the same names imported under
    ``TYPE_CHECKING`` for type checkers.
    """

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where), name)

    return __getattr__
