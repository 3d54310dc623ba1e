#!/usr/bin/env bash
# The two commands of the README:
#   bash run.sh demo   -> set up, then run the demo agent session on the embedded SQLite default
#   bash run.sh test   -> set up, then run every check and test against memory, SQLite, JSONL and a
#                         throwaway PostgreSQL server this script starts and stops itself
set -euo pipefail
cd "$(dirname "$0")"
VENV="${PICO_VENV:-.venv}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  # Reinstall when the dependency list changed since the last set-up.
  stamp="$VENV/.pico-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e '.[dev]'
    touch "$stamp"
  fi
}

case "${1:-}" in
  demo)
    setup
    shift
    exec "$VENV/bin/python" -m pico demo "$@"
    ;;
  test)
    setup
    export PATH="$PWD/$VENV/bin:$PATH"
    echo "== ruff";          ruff check . && ruff format --check .
    echo "== mypy --strict"; mypy
    echo "== import-linter"; lint-imports
    echo "== pytest (memory, SQLite, PostgreSQL, JSONL)"
    # shellcheck source=.ci/postgres.sh
    source .ci/postgres.sh start
    trap '.ci/postgres.sh stop' EXIT
    export PICO_REQUIRE_ALL_BACKENDS=1
    python -m pytest -q -p no:randomly "${@:2}"
    ;;
  *)
    echo "usage: bash run.sh demo | bash run.sh test" >&2
    exit 2
    ;;
esac
