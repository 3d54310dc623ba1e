#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL server for the test suite.
#   source .ci/postgres.sh start   -> exports PICO_TEST_POSTGRES_URL
#   .ci/postgres.sh stop
# Debian's binaries refuse to initdb as root, so the cluster belongs to the postgres user.
set -euo pipefail
PGDATA_DIR="${PICO_PG_DIR:-/tmp/pico-pg}"
PGPORT="${PICO_PG_PORT:-54329}"

find_bin() {
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  command -v pg_ctl >/dev/null && dirname "$(command -v pg_ctl)" && return 0
  return 1
}

as_pg() {
  if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-start}" in
  start)
    BIN="$(find_bin)" || { echo "PostgreSQL binaries not found" >&2; exit 1; }
    if [ -f "$PGDATA_DIR/data/postmaster.pid" ]; then
      as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PGDATA_DIR"
    mkdir -p "$PGDATA_DIR"
    if [ "$(id -u)" = "0" ]; then chown postgres: "$PGDATA_DIR"; fi
    as_pg "$BIN/initdb" -D "$PGDATA_DIR/data" -U postgres --auth=trust -E UTF8 >"$PGDATA_DIR/initdb.log" 2>&1
    as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR/data" -l "$PGDATA_DIR/server.log" -w \
      -o "-p $PGPORT -k $PGDATA_DIR -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200" start >/dev/null
    as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U postgres pico_test
    export PICO_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$PGPORT/pico_test"
    echo "PostgreSQL ready at $PICO_TEST_POSTGRES_URL"
    ;;
  stop)
    BIN="$(find_bin)" || exit 0
    if [ -f "$PGDATA_DIR/data/postmaster.pid" ]; then
      as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR/data" -m fast stop >/dev/null
    fi
    ;;
esac
