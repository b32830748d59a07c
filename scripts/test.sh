#!/usr/bin/env bash
# The whole suite on SQLite, then on PostgreSQL. With DATABASE_URL set, that server is
# used for the PostgreSQL run; otherwise a throwaway cluster is started and removed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PYTHONDONTWRITEBYTECODE=1
status=0

# Chromium and redis-server (apt-installed when missing and we are root).
scripts/system-deps.sh || { echo "could not install the system packages the tests need"; exit 1; }

echo "=== ruff (lint + import order; ruff.toml) ==="
$PY -m ruff check . || status=1

echo "=== test suite on SQLite ==="
env -u DATABASE_URL $PY -m pytest "$@" || status=$?

echo "=== test suite on PostgreSQL ==="
if [ -n "${DATABASE_URL:-}" ]; then
  $PY -m pytest "$@" || status=$?
else
  # Not under the clone: it may sit in a private directory the postgres user cannot enter.
  pgdir=$(mktemp -d /tmp/agentloop-pg-test-XXXXXX)
  trap 'scripts/pg.sh stop "$pgdir"' EXIT
  url=$(scripts/pg.sh start "$pgdir") || { echo "could not start PostgreSQL (see $pgdir)"; cat "$pgdir"/*.log 2>/dev/null; exit 1; }
  DATABASE_URL=$url $PY -m pytest "$@" || status=$?
fi
exit $status
