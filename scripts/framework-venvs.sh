#!/usr/bin/env bash
# Build .venv-frameworks/<name>, one virtual environment per agent framework, from
# requirements/frameworks/<name>.txt (each pins the framework and everything it pulls in;
# the frameworks pin their own dependencies, which conflict with .venv's). No system site
# packages, no torch, nothing of servehall: tests/test_frameworks_e2e.py runs
# tests/frameworks/<name>_run.py with these interpreters against a real server.
#
# Usage: scripts/framework-venvs.sh [NAME...]   (default: every requirements file)
# Idempotent: a venv whose stamp (the SHA-256 of its requirements file) matches is left as
# it is (a second run takes well under a second); a changed file rebuilds that venv from
# scratch. `scripts/install.sh --dev` runs it, and so does tests/test_frameworks_e2e.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# install.sh's torch constraint is not for these environments
unset PIP_CONSTRAINT
mkdir -p .venv-frameworks
# one build at a time (install.sh and the test module may both run this)
exec 9>.venv-frameworks/.lock
flock 9
if [ "$#" -eq 0 ]; then
  set -- $(cd requirements/frameworks && ls *.txt | sed 's/\.txt$//')
fi
build() {  # NAME: a fresh venv from its requirements file, then its stamp
  local venv=".venv-frameworks/$1" req="requirements/frameworks/$1.txt"
  rm -rf "$venv" &&
    "$PY" -m venv "$venv" &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" &&
    sha256sum "$req" | cut -d' ' -f1 > "$venv/.stamp"
}
# the stale ones build side by side: pip spends its time waiting on the index, not the CPU
pids=()
names=()
for name in "$@"; do
  req="requirements/frameworks/$name.txt"
  [ -f "$req" ] || { echo "framework-venvs: no $req" >&2; exit 2; }
  want=$(sha256sum "$req" | cut -d' ' -f1)
  venv=".venv-frameworks/$name"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$want" ]; then
    continue
  fi
  echo "framework-venvs: building $venv"
  build "$name" > ".venv-frameworks/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "framework-venvs: building .venv-frameworks/${names[$i]} failed:" >&2
    tail -40 ".venv-frameworks/${names[$i]}.log" >&2
    failed=1
  fi
done
exit "$failed"
