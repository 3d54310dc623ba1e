#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL server for the test suite.
#   source .ci/postgres.sh start   -> exports PICO_TEST_POSTGRES_URL
#   .ci/postgres.sh stop
# Debian's binaries refuse to initdb as root, so the cluster belongs to the postgres user.
set -euo pipefail
PGDATA_DIR="${PICO_PG_DIR:-/tmp/pico-pg}"
# A fixed default can collide with an ephemeral client port (Linux uses 32768-60999), so
# the default is a random port below that range, retried on a bind failure.
PGPORT="${PICO_PG_PORT:-}"

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
    started=""
    for attempt in 1 2 3 4 5 6 7 8; do
      port="${PGPORT:-$((20000 + RANDOM % 12000))}"
      if as_pg "$BIN/pg_ctl" -D "$PGDATA_DIR/data" -l "$PGDATA_DIR/server.log" -w \
        -o "-p $port -k $PGDATA_DIR -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200" \
        start >/dev/null; then
        started="$port"
        break
      fi
      echo "PostgreSQL did not start on port $port (attempt $attempt); retrying" >&2
      [ -n "$PGPORT" ] && break
    done
    if [ -z "$started" ]; then
      tail -n 20 "$PGDATA_DIR/server.log" >&2
      echo "could not start PostgreSQL" >&2
      exit 1
    fi
    PGPORT="$started"
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
