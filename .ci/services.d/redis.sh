#!/usr/bin/env bash
# Redis for the scale-out tests: Debian's redis-server, installed when missing. The tests
# start their own redis-server processes on free loopback ports (so they can stop and
# restart them), so nothing is started here; this script only makes the binary present.
# Tests look for redis-server on PATH and in /usr/bin and /usr/sbin.
# Idempotent: installs only when missing.
set -euo pipefail
source "$(dirname "$0")/../lib/debian_tool.sh"
debian_tool redis.sh redis-server redis-server redis-server
