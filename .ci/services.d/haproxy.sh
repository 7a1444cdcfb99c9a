#!/usr/bin/env bash
# HAProxy for the scale-out test (two replicas behind a load balancer): Debian's haproxy,
# installed when missing. The test writes its own haproxy.cfg (the same topology as
# deploy/haproxy.cfg) and runs haproxy in the foreground on free loopback ports, so
# nothing is started here. Idempotent: installs only when missing.
set -euo pipefail
source "$(dirname "$0")/../lib/debian_tool.sh"
debian_tool haproxy.sh haproxy haproxy haproxy
