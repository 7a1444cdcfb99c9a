#!/usr/bin/env bash
# Stop the services .ci/services.sh started (`make services-stop`). Only scripts in
# .ci/services.d/ that say "supports: stop" are asked (`NAME.sh stop`); data is kept, and
# the next `make test` starts them again.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .ci/services.d/*.sh; do
  [ -e "$f" ] || continue
  if grep -q "supports: stop" "$f"; then
    bash "$f" stop
  else
    echo "services-stop: $f cannot stop its service; stop it by hand" >&2
  fi
done
