# Sourced by .ci/services.d/*.sh: make one Debian-packaged tool present (never start it).
#   debian_tool SCRIPT BINARY PACKAGE SERVICE
# SCRIPT names the caller in messages; BINARY is looked up on PATH, /usr/bin and
# /usr/sbin; PACKAGE is installed with apt-get (no recommends) when BINARY is missing and
# this is root (else a note, exit 0); SERVICE is the package's own service, stopped after
# install (the tests run their own processes). Prints the tool's version line.
debian_tool() {
  local script=$1 binary=$2 package=$3 service=$4 path
  path=$(command -v "$binary" 2>/dev/null || true)
  for p in "/usr/bin/$binary" "/usr/sbin/$binary"; do
    [ -n "$path" ] || { [ -x "$p" ] && path=$p; } || true
  done
  if [ -z "$path" ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "$script: $binary is not installed and this is not root; skipping" >&2
      return 0
    fi
    echo "$script: installing $package from Debian packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$package" >/dev/null
    if command -v service >/dev/null 2>&1; then service "$service" stop >/dev/null 2>&1 || true; fi
    path=$(command -v "$binary" 2>/dev/null || echo "/usr/sbin/$binary")
  fi
  echo "$script: $("$path" --version 2>&1 | head -n 1)"
}
