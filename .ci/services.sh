#!/usr/bin/env bash
# Start the services the test suite needs (PostgreSQL on loopback once the records layer
# lands). Idempotent; safe to run on a developer machine.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .ci/services.d/*.sh; do
  [ -e "$f" ] || continue
  bash "$f"
done
