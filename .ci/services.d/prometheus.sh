#!/usr/bin/env bash
# promtool for the alert-rule unit tests (tests/test_alert_rules.py runs `promtool check
# rules` and `promtool test rules` on deploy/prometheus/): Debian's prometheus package,
# installed when missing. Nothing is started (the package's own service is stopped).
# Idempotent: installs only when missing.
set -euo pipefail
source "$(dirname "$0")/../lib/debian_tool.sh"
debian_tool prometheus.sh promtool prometheus prometheus
