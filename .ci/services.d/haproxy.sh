#!/usr/bin/env bash
# HAProxy for the scale-out test (two replicas behind a load balancer): Debian's haproxy,
# installed when missing. The test writes its own haproxy.cfg (the same topology as
# deploy/haproxy.cfg) and runs haproxy in the foreground on free loopback ports, so
# nothing is started here. Idempotent: installs only when missing.
set -euo pipefail

if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
  echo "haproxy.sh: $( (haproxy -v 2>/dev/null || /usr/sbin/haproxy -v) | head -n 1)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "haproxy.sh: haproxy is not installed and this is not root; skipping" >&2
  exit 0
fi
echo "haproxy.sh: installing haproxy from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends haproxy >/dev/null
if command -v service >/dev/null 2>&1; then service haproxy stop >/dev/null 2>&1 || true; fi
echo "haproxy.sh: $(haproxy -v | head -n 1)"
