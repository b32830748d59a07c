#!/usr/bin/env bash
# The whole suite on SQLite and on PostgreSQL. With DATABASE_URL set, that server is
# used for the PostgreSQL pass; otherwise a throwaway cluster is started and removed.
#
# Most tests wait on processes (web server, workers, fake platforms) more than they
# compute (a pass alone kept about one of CI's two cores busy), so the two passes run at
# the same time, in three phases:
#   1. `-m "not serial"` on SQLite and on PostgreSQL at once: the busy phase.
#   2. `-m "serial and not alone"` on both at once: tests that assert on the wall clock
#      (tests/conftest.py SERIAL), with nothing else beside them.
#   3. `-m alone` on both at once: tests that kill or cut what the machine shares —
#      workers, the database, network namespaces — and time the recovery, and those that
#      drive a browser (tests/conftest.py ALONE), never two of a kind at the same moment.
# The checks (ruff, import layers, types, docs) run from the start to their end at idle
# priority (SCHED_IDLE: only on CPU no test wants), and so do the unit tests of both passes
# (tests/unit/, not serial: the backfill) from the end of the busy phase, beside the serial
# and alone phases, which leave about one of two cores idle. Each pass of a phase writes
# its own log, printed whole when both are done (a progress line every minute meanwhile). Each test runs in one pass or both
# (conftest.py's OWN_DATABASE, ANY_DATABASE and ONE_PASS say which run once, and where).
# Arguments go to every pytest run (a `-m` of your own replaces the phase's).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
status=0
user_args=$#

# Chromium and redis-server (apt-installed when missing and we are root).
scripts/system-deps.sh || { echo "could not install the system packages the tests need"; exit 1; }

# Bytecode is written here even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# without it, every pytest process rewrote the asserts of all 400 test modules again, 8.6 s
# of CPU where reading them back costs 3.9 s (a dozen pytest processes per run).
unset PYTHONDONTWRITEBYTECODE

# The project compiled once here, not by each of the few hundred web servers and workers
# the tests start (a fresh clone has no __pycache__: 0.3 s of CPU per process start,
# measured), and the test modules collected once, so that pytest's rewritten modules are
# cached for every pytest process after it. That collection imports, so compiles and
# writes the bytecode of, 3,044 modules of the venv's packages (the Makefile installs them
# without bytecode): all that a web server or a worker imports but 58. Not `compileall
# .venv/lib` any more: 16,257 files, 26 s of CPU, 5 s of it for those (issue 52). A
# package only some tests import (moto, playwright) is compiled by its first importer, once.
run_started=$SECONDS
{ $PY -m compileall -q -j 0 -x node_modules agentloop conversations delivery tools audit tests manage.py >/dev/null \
    && $PY -m pytest --collect-only -q -p no:cacheprovider >/dev/null; } &
warm_up=$!
# The Matrix tests' homeserver (Synapse in var/synapse-venv, from requirements-synapse.txt):
# installed meanwhile; the tests that start it wait for this (scripts/synapse.sh's lock).
scripts/synapse.sh >/dev/null &

logs=$(mktemp -d /tmp/agentloop-test-logs-XXXXXX)
pgdir=""
backfill_pgdir=""
checks=""
backfill=""
children=()
cleanup() {
  for pid in "${children[@]}" $checks $backfill; do kill "$pid" 2>/dev/null; done
  [ -n "$pgdir" ] && scripts/pg.sh stop "$pgdir"
  [ -n "$backfill_pgdir" ] && scripts/pg.sh stop "$backfill_pgdir"
  rm -rf "$logs"
}
trap cleanup EXIT

# SCHED_IDLE (chrt -i): the scheduler runs these only on a core no other process wants,
# and a woken test process preempts them at once, so they slow no test's clock (nice 19
# still took a share beside the busy phase's tests: 15 of 1024). `nice` where chrt is missing.
idle_priority() {  # a process id: it and the processes it starts from now on
  chrt -i -p 0 "$1" >/dev/null 2>&1 || renice -n 19 -p "$1" >/dev/null
}

# The peer benchmark's bot's packages (`npm ci` from its lockfile, tests/bench/peer.py: 5 s
# of CPU): its first test, in the serial phase, waited 17 s for them. Installed meanwhile,
# at idle priority (at normal priority it took CPU from the warm-up, which the tests wait
# for); that test waits under the same lock only if they are not there yet.
{ idle_priority "$BASHPID"; $PY -c "from tests.bench.peer import ensure_node_modules; ensure_node_modules()"; } \
  >/dev/null 2>&1 &

# The checks run from the start at idle priority: they take the CPU the warm-up's
# collection leaves (one core), the busy phase's gaps, then the serial and alone phases'
# (38 s of a 15 min 44 s run as a phase of their own before the tests, once). Their output
# is printed at the end.
{
  idle_priority "$BASHPID"  # before the first check starts: they inherit it
  status=0 failed=()
  check() {  # a name, then its command: a failure is named with its exit status, however quietly it failed
    local name=$1 rc; shift
    echo "=== $name ==="
    "$@"; rc=$?
    [ "$rc" = 0 ] || { status=1; failed+=("$name: exit $rc"); }
  }
  check "ruff (lint + import order; ruff.toml)" $PY -m ruff check .
  check "import layers (lint-imports; .importlinter)" .venv/bin/lint-imports
  check "types (mypy; mypy.ini)" scripts/types.sh
  check "docs (mkdocs build --strict)" scripts/docs.sh
  echo "=== checks: done $(( SECONDS - run_started )) s after the start (at idle priority, beside the tests)${failed[*]:+; failed: ${failed[*]}} ==="
  echo "$status" >"$logs/checks.status"
  exit $status
} >"$logs/checks.log" 2>&1 &
checks=$!

if [ -n "${DATABASE_URL:-}" ]; then
  pg_url=$DATABASE_URL
else
  # Not under the clone: it may sit in a private directory the postgres user cannot enter.
  pgdir=$(mktemp -d /tmp/agentloop-pg-test-XXXXXX)
  pg_url=$(scripts/pg.sh start "$pgdir") || { echo "could not start PostgreSQL (see $pgdir)"; cat "$pgdir"/*.log 2>/dev/null; exit 1; }
fi

# The backfill's PostgreSQL: a cluster of its own whose every backend runs at idle
# priority (started under it; a backend is a child of the postmaster, not of its client),
# so its queries never take a core from the suite's server. DATABASE_URL given: that server.
# Started beside the warm-up (its initdb at idle priority too), waited for when the backfill starts.
backfill_pgdir=""
backfill_pg_url=$pg_url
backfill_pg_start=""
if [ "$user_args" = 0 ] && [ -z "${DATABASE_URL:-}" ]; then
  backfill_pgdir=$(mktemp -d /tmp/agentloop-pg-backfill-XXXXXX)
  { idle_priority "$BASHPID"; scripts/pg.sh start "$backfill_pgdir" >"$logs/backfill-pg.url"; } &
  backfill_pg_start=$!
fi

wait "$warm_up" || { echo "compiling or collecting the tests failed (the passes below say where)"; status=1; }
echo "=== warm-up (the checks beside it at idle priority, until they are done): $(( SECONDS - run_started )) s ==="

# AGENTLOOP_TEST_PASS tells conftest.py which pass this is: a test run once is left out
# of the other (tests/conftest.py OWN_DATABASE, ANY_DATABASE, ONE_PASS).
sqlite_pytest() { env -u DATABASE_URL AGENTLOOP_TEST_PASS=sqlite $PY -m pytest "$@"; }
postgres_pytest() { DATABASE_URL=$pg_url AGENTLOOP_TEST_PASS=postgres $PY -m pytest "$@"; }

# pytest's "no tests collected" (5) is not a failure of one phase when the arguments
# select only serial tests, or none: the pass fails only if both of its phases found nothing.
passed() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
pass_status() {  # two phases' statuses: one for both
  if [ "$1" = 5 ] && [ "$2" = 5 ]; then echo 5
  elif passed "$1" && passed "$2"; then echo 0
  elif passed "$1"; then echo "$2"
  else echo "$1"; fi
}

progress() {  # pytest -q's last "[ NN%]" in a log
  grep -o '\[ *[0-9]*%\]' "$1" 2>/dev/null | tail -1 | tr -d '[] '
}

# The files a later phase's tests are in, as the busy phase's collection wrote them down
# (tests/conftest.py PHASE_FILES; only the busy phase is asked to: a later phase collects
# fewer files and would write shorter lists): that phase collects only those. None when
# the run was given arguments of its own (they say what to collect) or a list is missing.
phase_files() {  # a pass, a phase
  [ "$user_args" = 0 ] && [ -s "$logs/$2-$1.txt" ] && cat "$logs/$2-$1.txt"
}

status_or_gone() {  # a pass, a phase, its subshell's id: status 1 written if it ended without one
  [ -e "$logs/$1-$2.status" ] && return 0
  kill -0 "$3" 2>/dev/null && return 0
  sleep 1  # it may have written its status as it ended
  [ -e "$logs/$1-$2.status" ] || { echo "=== the $1 pass of the $2 phase ended without a status ==="; echo 1 >"$logs/$1-$2.status"; }
}

both_passes() {  # a phase's name, its -m expression, then pytest's arguments; sets $sqlite_rc $postgres_rc
  local phase=$1 marks=$2; shift 2
  echo "=== SQLite and PostgreSQL passes at once: $phase ==="
  # shellcheck disable=SC2046  # one file per word
  # Each pass's status is written to a file (read below): see the checks' status.
  { sqlite_pytest -m "$marks" "$@" $(phase_files sqlite "$phase") >"$logs/sqlite-$phase.log" 2>&1
    echo $? >"$logs/sqlite-$phase.status"; } &
  local sqlite_pid=$!
  # shellcheck disable=SC2046
  { postgres_pytest -m "$marks" "$@" $(phase_files postgres "$phase") >"$logs/postgres-$phase.log" 2>&1
    echo $? >"$logs/postgres-$phase.status"; } &
  local postgres_pid=$!
  children=("$sqlite_pid" "$postgres_pid")
  local started=$SECONDS next_report=$((SECONDS + 60))
  # Until both statuses are written (not `kill -0` of their ids: one may be another process's by then).
  while [ ! -e "$logs/sqlite-$phase.status" ] || [ ! -e "$logs/postgres-$phase.status" ]; do
    sleep 2
    # A pass whose subshell is gone without writing its status (killed whole) failed; a
    # reused id can only make a dead pass look alive, never a live one dead.
    status_or_gone sqlite "$phase" "$sqlite_pid"
    status_or_gone postgres "$phase" "$postgres_pid"
    if (( SECONDS >= next_report )); then
      next_report=$((next_report + 60))
      local sqlite_done postgres_done
      sqlite_done=$(progress "$logs/sqlite-$phase.log") postgres_done=$(progress "$logs/postgres-$phase.log")
      echo "  $(( (SECONDS - started) / 60 )) min: SQLite ${sqlite_done:-0%}, PostgreSQL ${postgres_done:-0%}"
    fi
  done
  wait "$sqlite_pid" "$postgres_pid"
  sqlite_rc=$(cat "$logs/sqlite-$phase.status" 2>/dev/null || echo 1)
  postgres_rc=$(cat "$logs/postgres-$phase.status" 2>/dev/null || echo 1)
  children=()
  echo "=== test suite on SQLite: $phase (ran beside PostgreSQL's) ==="
  cat "$logs/sqlite-$phase.log"
  echo "=== test suite on PostgreSQL: $phase (ran beside SQLite's) ==="
  cat "$logs/postgres-$phase.log"
  echo "=== $phase: $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s ==="
}

# Three tests at a time per pass (pytest-xdist), six in all: one at a time per pass kept
# only about one of the two cores busy (sampled every 30 s through a whole busy phase:
# 0.8-1.25 cores), the rest of the time each test waits on its processes and windows;
# two at a time, 1.4-2.0. `worksteal` hands a long test's neighbours to an idle worker.
# AGENTLOOP_TEST_WORKERS=0 runs one test at a time (and the serial phase too).
busy_workers=${AGENTLOOP_TEST_WORKERS:-3}
busy_args=()
[ "$busy_workers" != 0 ] && busy_args=(-n "$busy_workers" --dist worksteal)
# The unit tests (tests/unit/, a pytest process per pass) are left to the backfill when
# the run was given no arguments: 240 s of CPU of the busy phase's 1,300 (measured: 121
# on SQLite, 103 + 14 of the server's on PostgreSQL), done at idle priority beside the
# serial and alone phases instead. Not beside the busy phase: that one leaves no core
# idle, and a starved unit test would meet its own waits' deadlines.
busy_marks="not serial"
[ "$user_args" = 0 ] && busy_marks="not serial and not unit"
export AGENTLOOP_PHASE_FILES=$logs
both_passes not-serial "$busy_marks" "${busy_args[@]}" "$@"
unset AGENTLOOP_PHASE_FILES
sqlite_concurrent=$sqlite_rc postgres_concurrent=$postgres_rc
sqlite_unit=5 postgres_unit=5
if [ -n "$backfill_pg_start" ]; then
  wait "$backfill_pg_start"  # its outcome is the URL it wrote (not `wait`'s status: see the checks')
  if [ -s "$logs/backfill-pg.url" ]; then
    backfill_pg_url=$(cat "$logs/backfill-pg.url")
  else
    echo "could not start the backfill's PostgreSQL (see $backfill_pgdir): its unit tests run on the suite's"
  fi
fi
# The migrated templates the busy phase left on the suite's server, copied onto the
# backfill's cluster (tests/support/template_db.py names and finds them): its PostgreSQL
# process then copies one as every other process does, where it migrated its own from
# nothing, at idle priority: 50 s before its first test, at the head of a chain that
# ended after the alone phase. A failed copy leaves it to do that.
copy_templates() {
  local name dump
  for name in $(psql "$pg_url" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'test\_template\_%'"); do
    dump="$logs/$name.dump"
    if pg_dump --no-owner -Fc -f "$dump" "${pg_url%/*}/$name" \
        && psql "$backfill_pg_url" -qc "CREATE DATABASE $name" \
        && pg_restore --no-owner --exit-on-error -d "${backfill_pg_url%/*}/$name" "$dump"; then
      echo "=== backfill: template $name copied onto its cluster ===" >>"$logs/postgres-unit.log"
    else
      psql "$backfill_pg_url" -qc "DROP DATABASE IF EXISTS $name" >/dev/null 2>&1
    fi
    rm -f "$dump"
  done
}
if [ "$user_args" = 0 ]; then
  {
    idle_priority "$BASHPID"
    sqlite_pytest -m "unit and not serial" tests/unit >"$logs/sqlite-unit.log" 2>&1 &
    sqlite_unit_pid=$!
    [ -n "$backfill_pgdir" ] && [ "$backfill_pg_url" != "$pg_url" ] && copy_templates >>"$logs/postgres-unit.log" 2>&1
    DATABASE_URL=$backfill_pg_url AGENTLOOP_TEST_PASS=postgres $PY -m pytest -m "unit and not serial" tests/unit \
      >>"$logs/postgres-unit.log" 2>&1
    postgres_unit_rc=$?
    wait "$sqlite_unit_pid"
    echo "$? $postgres_unit_rc" >"$logs/unit.status"
  } &
  backfill=$!
fi
# The serial tests three at a time per pass as well, a file's tests together (a file may
# share one thing across its tests: the peer bot's node_modules). They wait on windows,
# paces and streams far more than they compute: two passes of one at a time kept 0.3-1.1
# cores busy, two of two at a time about one core (the backfill took the other), and
# their bounds were set beside the other pass's.
serial_args=()
[ "$busy_workers" != 0 ] && serial_args=(-n "$busy_workers" --dist loadfile)
both_passes serial "serial and not alone" "${serial_args[@]}" "$@"
sqlite_timed=$sqlite_rc postgres_timed=$postgres_rc
# Both passes at once, but never two tests of a kind at the same moment: a pass holds the
# machine-wide lock of a kind through its tests of that kind (tests/conftest.py
# ALONE_LOCKS), so a test that kills or cuts something runs beside at most a browser
# test, never beside another such test (side by side, a restart test's 3 s bound failed
# once in two runs beside the other pass's database faults).
export AGENTLOOP_ALONE_LOCKS=$logs
both_passes alone "alone" "$@"
sqlite_alone=$sqlite_rc postgres_alone=$postgres_rc

if [ -n "$backfill" ]; then
  backfill_started=$SECONDS
  wait "$backfill"
  backfill=""
  read -r sqlite_unit postgres_unit <"$logs/unit.status" || { sqlite_unit=1 postgres_unit=1; }
  echo "=== test suite on SQLite: unit (the backfill, at idle priority beside the serial and alone phases) ==="
  cat "$logs/sqlite-unit.log"
  echo "=== test suite on PostgreSQL: unit (the backfill, at idle priority beside the serial and alone phases) ==="
  cat "$logs/postgres-unit.log"
  echo "=== backfill: waited $(( SECONDS - backfill_started )) s for it after the alone phase ==="
fi
# Their status from the file they write, not from `wait`: bash forgets a finished job's
# status once a later child of this shell is given its process id (pid_max 32,768, and a
# run starts tens of thousands of processes: `wait` then said 127 of checks that passed).
wait "$checks"
checks_rc=$(cat "$logs/checks.status" 2>/dev/null || echo "no status written")
cat "$logs/checks.log"
# Named even when the log says nothing of it (once a run's checks printed clean and exited 1).
[ "$checks_rc" = 0 ] || { echo "=== the checks exited $checks_rc ==="; status=1; }
checks=""

sqlite_status=$(pass_status "$(pass_status "$sqlite_concurrent" "$sqlite_unit")" "$(pass_status "$sqlite_timed" "$sqlite_alone")")
postgres_status=$(pass_status "$(pass_status "$postgres_concurrent" "$postgres_unit")" \
                              "$(pass_status "$postgres_timed" "$postgres_alone")")
echo "=== SQLite pass: exit $sqlite_concurrent (not serial), $sqlite_unit (unit), $sqlite_timed (serial), $sqlite_alone (alone);" \
     "PostgreSQL pass: exit $postgres_concurrent (not serial), $postgres_unit (unit), $postgres_timed (serial)," \
     "$postgres_alone (alone) ==="
echo "=== the whole run: $(( SECONDS / 60 )) min $(( SECONDS % 60 )) s ==="
[ "$sqlite_status" != 0 ] && status=$sqlite_status
[ "$postgres_status" != 0 ] && status=$postgres_status
exit $status
