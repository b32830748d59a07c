#!/usr/bin/env bash
# `make bench`: every benchmark on SQLite (or DATABASE_URL), then the guard overhead on
# PostgreSQL too (a throwaway cluster when DATABASE_URL is not given), since the guard
# issue asks for both. Arguments pick benchmarks: scripts/bench.sh guard
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
names=("$@")
$PY -m tests.bench "${names[@]}"
if [ -z "${DATABASE_URL:-}" ] && { [ ${#names[@]} -eq 0 ] || [[ " ${names[*]} " == *" guard "* ]]; }; then
  echo; echo "=== guard overhead on PostgreSQL ==="
  pgdir="$(pwd)/var/pg-bench-$$"
  trap 'scripts/pg.sh stop "$pgdir"' EXIT
  url=$(scripts/pg.sh start "$pgdir")
  DATABASE_URL=$url $PY -m tests.bench guard
fi
