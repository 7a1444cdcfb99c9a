"""The demo model: a tiny Llama-style Hugging Face model built locally, deterministically.

``build_demo_model(out)`` writes a complete model directory (weights, config, byte-level
BPE tokenizer with a chat template) in a few seconds; nothing is downloaded. Used by
``servehall demo-model``, ``servehall serve --demo`` and the tests.

``DEFAULT_DEMO_DIR`` is ``$SERVEHALL_CACHE_DIR/demo-model`` (default
``~/.cache/servehall/demo-model``), evaluated at import; call :func:`default_demo_dir` to
re-read the environment. ``DEMO_MODEL_SETTINGS`` are the ``[[models]]`` settings
``servehall serve --demo`` gives the demo model (the tests' demo config uses them too).
"""

from __future__ import annotations

from servehall.demo.build import build_demo_model, default_demo_dir
from servehall.demo.model import CONTEXT_LENGTH
from servehall.demo.tokenizer import DEMO_CHAT_TEMPLATE, SPECIAL_TOKENS

DEFAULT_DEMO_DIR = default_demo_dir()
DEMO_MODEL_SETTINGS: dict[str, str] = {"tool_call_grammar": "always"}
"""``[[models]]`` settings of the demo model beside its name, path and backend: a lazy
tool-call grammar under ``tool_choice: "auto"`` (a briefly trained model often writes a
call to another tool or broken call JSON; docs/api.md#the-demo-model-and-agents)."""

__all__ = [
    "CONTEXT_LENGTH",
    "DEFAULT_DEMO_DIR",
    "DEMO_CHAT_TEMPLATE",
    "DEMO_MODEL_SETTINGS",
    "SPECIAL_TOKENS",
    "build_demo_model",
    "default_demo_dir",
]
