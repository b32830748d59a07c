#!/usr/bin/env bash
# `make bench`: every benchmark on SQLite (or DATABASE_URL), then the guard overhead on
# PostgreSQL too (a throwaway cluster when DATABASE_URL is not given), since the guard
# issue asks for both (and the MCP guard's, issue 27; the retention sweep's, issue 26: 1 million
# rows on each; the grown database's, issue 30; the platforms', issue 54). Arguments pick benchmarks: scripts/bench.sh guard mcp retention
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
names=("$@")
# The venv's bytecode (the Makefile installs without it), once: every benchmark starts processes.
$PY -m compileall -q -j 0 .venv/lib >/dev/null
# The peer benchmark's Chat SDK bot (tests/bench/peer/): its packages from the lockfile,
# when node is here and they are not installed yet (without node the benchmark says so).
if command -v node >/dev/null && [ ! -f tests/bench/peer/node_modules/chat/package.json ]; then
  npm ci --no-audit --no-fund --prefix tests/bench/peer
fi
# Every process below records the targets it measured; the list is printed once, at the end.
export BENCH_TARGETS_KEEP=1
$PY -c 'from tests.bench import targets; targets.reset()'
$PY -m tests.bench "${names[@]}"
pg_names=()
for name in guard mcp retention grown platforms; do
  if [ ${#names[@]} -eq 0 ] || [[ " ${names[*]} " == *" $name "* ]]; then pg_names+=("$name"); fi
done
if [ -z "${DATABASE_URL:-}" ] && [ ${#pg_names[@]} -gt 0 ]; then
  echo; echo "=== on PostgreSQL (${pg_names[*]}) ==="
  # Not under the clone: it may sit in a private directory the postgres user cannot enter.
  pgdir=$(mktemp -d /tmp/agentloop-pg-bench-XXXXXX)
  trap 'scripts/pg.sh stop "$pgdir"' EXIT
  url=$(scripts/pg.sh start "$pgdir")
  DATABASE_URL=$url $PY -m tests.bench "${pg_names[@]}"
fi
$PY -m tests.bench.targets
