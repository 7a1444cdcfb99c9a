#!/usr/bin/env bash
# Create .venv (if missing) and install every workspace member editable, with dev tools.
# Usage: scripts/install.sh [--dev]
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
