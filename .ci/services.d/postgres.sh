#!/usr/bin/env bash
# PostgreSQL for the record tests: Debian's server, initdb'ed as a non-root user, on
# 127.0.0.1:${SERVEHALL_PG_PORT:-55432}, with role/database servehall/servehall_test.
# Tests read SERVEHALL_TEST_PG_URL (default
# postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/servehall_test).
# Idempotent: installs only when missing, initdb only once, starts only when stopped.
# `postgres.sh stop` stops the server (the data directory stays); supports: stop
set -euo pipefail

PORT="${SERVEHALL_PG_PORT:-55432}"
ROOT="${SERVEHALL_PG_DIR:-/tmp/servehall-pg}"
DATA="$ROOT/data"
SOCK="$ROOT/run"
LOG="$ROOT/server.log"

find_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  return 1
}

if [ "${1:-}" = "stop" ] && ! find_bin >/dev/null; then
  echo "postgres.sh: PostgreSQL is not installed; nothing to stop"
  exit 0
fi

if ! BIN=$(find_bin); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "postgres.sh: PostgreSQL is not installed and this is not root; skipping" >&2
    exit 0
  fi
  echo "postgres.sh: installing PostgreSQL from Debian packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  BIN=$(find_bin)
fi

# initdb refuses to run as root: run the server as the 'postgres' user when we are root.
if [ "$(id -u)" -eq 0 ]; then
  RUNAS=postgres
  id -u "$RUNAS" >/dev/null 2>&1 || useradd --system --home-dir "$ROOT" --shell /bin/sh "$RUNAS"
  as_pg() { runuser -u "$RUNAS" -- "$@"; }
else
  RUNAS=$(id -un)
  as_pg() { "$@"; }
fi

if [ "${1:-}" = "stop" ]; then
  cd /  # the server user may not be able to read the caller's working directory
  if [ -s "$DATA/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    as_pg "$BIN/pg_ctl" -D "$DATA" -w -t 60 -m fast stop >/dev/null
    echo "postgres.sh: stopped PostgreSQL on 127.0.0.1:$PORT (data kept in $DATA)"
  else
    echo "postgres.sh: PostgreSQL on 127.0.0.1:$PORT is not running"
  fi
  exit 0
fi

mkdir -p "$ROOT" "$SOCK"
cd "$ROOT"  # the server user may not be able to read the caller's working directory
chown "$RUNAS" "$ROOT" "$SOCK" 2>/dev/null || true
chmod 700 "$ROOT" 2>/dev/null || true

if [ ! -s "$DATA/PG_VERSION" ]; then
  as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >/dev/null 2>&1 \
    || as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=trust \
      --auth-host=scram-sha-256 -E UTF8 --no-locale >/dev/null
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$SOCK -c fsync=off -c max_connections=200" \
    start >/dev/null
fi

for _ in $(seq 1 60); do
  if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then break; fi
  sleep 0.5
done
"$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" || { echo "postgres.sh: server not ready" >&2; tail -n 20 "$LOG" >&2; exit 1; }

psql_su() { as_pg "$BIN/psql" -h "$SOCK" -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [ "$(psql_su -c "SELECT 1 FROM pg_roles WHERE rolname = 'servehall'")" != "1" ]; then
  psql_su -c "CREATE ROLE servehall LOGIN PASSWORD 'servehall' CREATEDB"
fi
# DROP DATABASE ... WITH (FORCE) in the tests' teardown also ends an autovacuum worker that
# is busy in that database; a non-superuser may do so only as a member of pg_signal_backend.
psql_su -c "GRANT pg_signal_backend TO servehall" 2>/dev/null || true
if [ "$(psql_su -c "SELECT 1 FROM pg_database WHERE datname = 'servehall_test'")" != "1" ]; then
  psql_su -c "CREATE DATABASE servehall_test OWNER servehall"
fi
echo "postgres.sh: PostgreSQL ready on 127.0.0.1:$PORT (data $DATA)"
