#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: `scripts/pg.sh start DIR` prints a
# DATABASE_URL; `scripts/pg.sh stop DIR` removes it. `down DIR` / `up DIR` stop and
# start it again on the same port, data kept (the outage tests). PostgreSQL refuses to
# run as root, so as root the cluster runs as the `postgres` user in a folder it owns:
# DIR must be reachable by that user (under /tmp, e.g. `mktemp -d /tmp/agentloop-pg-XXXXXX`),
# not inside a clone that may sit in a private (0700) directory.
set -euo pipefail
cmd=$1 dir=$(realpath -m "$2")

bindir() {
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  dirname "$(command -v pg_ctl)"
}
BIN=$(bindir)
# From /: the postgres user may not enter the directory we were started in.
as_owner() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }

serve() {
  as_owner "$BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 30 \
    -o "-p $2 -k $1 -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >/dev/null
}

case $cmd in
start)
  rm -rf "$dir"; mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  as_owner "$BIN/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1
  echo "$port" >"$dir/port"
  serve "$dir" "$port"
  "$BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres agentloop  # the URL printed below must work as is
  echo "postgres://postgres@127.0.0.1:$port/agentloop"
  ;;
down)
  as_owner "$BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  ;;
up)
  serve "$dir" "$(cat "$dir/port")"
  ;;
stop)
  [ -d "$dir/data" ] && as_owner "$BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  ;;
esac
