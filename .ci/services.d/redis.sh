#!/usr/bin/env bash
# Redis for the scale-out tests: Debian's redis-server, installed when missing. The tests
# start their own redis-server processes on free loopback ports (so they can stop and
# restart them), so nothing is started here; this script only makes the binary present.
# Tests look for redis-server on PATH and in /usr/bin and /usr/sbin.
# Idempotent: installs only when missing.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
  echo "redis.sh: $(redis-server --version 2>/dev/null || /usr/bin/redis-server --version)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "redis.sh: redis-server is not installed and this is not root; skipping" >&2
  exit 0
fi
echo "redis.sh: installing redis-server from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: only the server binary; the packaged service is not used
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# the package may start its own service on 6379; the tests do not use it
if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
echo "redis.sh: $(redis-server --version)"
