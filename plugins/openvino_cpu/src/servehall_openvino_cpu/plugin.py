"""Entry module of the ``openvino_cpu`` plugin (import-light: OpenVINO loads lazily)."""

from __future__ import annotations

SERVEHALL_HOOK_API = (1, 2)
