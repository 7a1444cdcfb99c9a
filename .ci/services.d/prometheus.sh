#!/usr/bin/env bash
# promtool for the alert-rule unit tests (tests/test_alert_rules.py runs `promtool check
# rules` and `promtool test rules` on deploy/prometheus/): Debian's prometheus package,
# installed when missing. Nothing is started (the package's own service is stopped).
# Idempotent: installs only when missing.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  echo "prometheus.sh: $(promtool --version 2>&1 | head -n 1)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "prometheus.sh: promtool is not installed and this is not root; skipping" >&2
  exit 0
fi
echo "prometheus.sh: installing promtool (Debian package prometheus)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi
echo "prometheus.sh: $(promtool --version 2>&1 | head -n 1)"
