#!/usr/bin/env bash
# Test hosts on this machine: Linux network namespaces joined by a bridge, each with its
# own addresses and host name, so the product runs as it would on several machines.
#
#   scripts/cluster.sh up        build the hosts, start PostgreSQL + Redis on db, migrate,
#                                start the web server and the worker on app-a and app-b
#   scripts/cluster.sh up --ha   the same with the database as production runs it: Patroni,
#                                a primary (db-a) and a synchronous replica (db-b), etcd and
#                                Redis on dcs (scripts/cluster-ha.sh)
#   scripts/cluster.sh status    hosts, addresses, processes, URLs
#   scripts/cluster.sh down      stop every process in the hosts, remove hosts, bridge, data
#   scripts/cluster.sh stop      stop every process in the hosts only (down removes the rest)
#   scripts/cluster.sh check     can it run here? (root, network namespaces)
#
# and, for fault drills (the fault test uses them):
#   scripts/cluster.sh kill HOST      SIGKILL every process on HOST (app-a, app-b)
#   scripts/cluster.sh start HOST     start HOST's processes again (after a kill)
#   scripts/cluster.sh unplug HOST    cut HOST's link to db (ip link set … down)
#   scripts/cluster.sh plug HOST      give it back
# and with --ha: `pgkill db-a` (SIGKILL its PostgreSQL), `unplug db-a` / `plug db-a` (its
# whole link), `primary` (which db host is), `redis stop` / `redis start`.
#
# Hosts (addresses: CLUSTER_NET, default 10.213, i.e. 10.213.0.0/24 and 10.213.1.0/24):
#   root namespace  10.213.0.1   the bridge; the load generator and a local Bot API live here
#   db              10.213.0.2   PostgreSQL :5432 and redis-server :6379 (also on its links)
#   app-a           10.213.0.11  daphne :8000, the worker loop, django-q2's cluster (only here)
#   app-b           10.213.0.12  daphne :8000, the worker loop
# Each app host reaches db over a link of its own (a veth pair, 10.213.1.0/30 for app-a,
# 10.213.1.4/30 for app-b), so one host can lose the database while its web server stays
# reachable. No namespace has a default route and nothing is NATed or forwarded: all
# traffic stays inside these namespaces and loopback.
#
# Root only (namespaces, links). The app hosts run .venv/bin/python from this clone as
# root; PostgreSQL runs as the `postgres` user in a folder under /tmp it owns (the clone
# may sit in a private directory it cannot enter), settings as scripts/pg.sh.
# Environment: CLUSTER_DIR (default /tmp/agentloop-cluster: data, logs), CLUSTER_PREFIX
# (default alc: names of the namespaces and links), CLUSTER_NET; the app hosts' settings
# (AGENTLOOP_*, LOG_LEVEL, …) are taken from the environment of `up` and kept for `start`.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin  # ip, runuser: not on every user's PATH, even root's under sudo
cd "$(dirname "$0")/.."
CLONE=$(pwd)
SELF=$CLONE/scripts/cluster.sh
PY=$CLONE/.venv/bin/python
NET=${CLUSTER_NET:-10.213}
STATE=${CLUSTER_DIR:-/tmp/agentloop-cluster}
P=${CLUSTER_PREFIX:-alc}  # at most 5 characters: link names are limited to 15
BRIDGE=$P-br
ROOT_ADDR=$NET.0.1
WEB_PORT=8000 PG_PORT=5432 REDIS_PORT=6379
HOSTS=(db app-a app-b)
BUILT=""
APPS=(app-a app-b)
TASKS_HOST=app-a  # django-q2's cluster runs on one host only
# shellcheck source=scripts/cluster-ha.sh
. "$CLONE/scripts/cluster-ha.sh"
# shellcheck source=scripts/network-lock.sh
. "$CLONE/scripts/network-lock.sh"
ha() { [ -f "$STATE/ha" ]; }  # this cluster was built with --ha
if ha; then ha_hosts; fi

ns() { echo "$P-$1"; }
front_addr() { case $1 in db) echo "$NET.0.2";; app-a) echo "$NET.0.11";; app-b) echo "$NET.0.12";; esac; }
# The db link of an app host: db's end, the app's end (a /30 each).
db_side() { case $1 in app-a) echo "$NET.1.1";; app-b) echo "$NET.1.5";; esac; }
app_side() { case $1 in app-a) echo "$NET.1.2";; app-b) echo "$NET.1.6";; esac; }
root_veth() { case $1 in db) echo "$P-db";; app-a) echo "$P-a";; app-b) echo "$P-b";; esac; }
say() { echo "cluster: $*"; }
die() { echo "cluster: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root: it creates network namespaces, a bridge and veth links (run: sudo $0 ${1:-up})"
}

need_netns() {
  command -v ip >/dev/null 2>&1 || die "the 'ip' command (Debian package iproute2) is missing: apt-get install iproute2"
  command -v unshare >/dev/null 2>&1 || die "the 'unshare' command (util-linux) is missing"
  local probe=$P-p$$ out
  if ! out=$(ip netns add "$probe" 2>&1); then
    die "network namespaces are not available here ('ip netns add' said: $out); the cluster needs them (a container needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  fi
  # The bridge probed inside the probe's namespace: the root namespace sees no change (a
  # browser test beside it would: tests/support/host_network.py).
  if ! out=$(ip -n "$probe" link add probe type bridge 2>&1); then
    ip netns del "$probe"
    die "the kernel refuses a bridge ('ip link add … type bridge' said: $out; try: modprobe bridge)"
  fi
  ip netns del "$probe"
}

exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(ns "$1")"; }

# Run a command on a host: its network namespace and a host name of its own (a UTS
# namespace), so the product's "same host" checks (engine.owner_gone) never see across.
on() {
  local host=$1; shift
  (exec_on "$host" "$@")
}

exec_on() {
  local host=$1; shift
  exec ip netns exec "$(ns "$host")" unshare --uts -- sh -c 'hostname "$0"; exec "$@"' "$host" "$@"
}

# Start a long-running process on a host in the background, in a session of its own,
# its output in STATE/HOST/NAME.log.
daemon() {
  local host=$1 name=$2; shift 2
  mkdir -p "$STATE/$host"
  setsid nohup "$SELF" _on "$host" "$@" >>"$STATE/$host/$name.log" 2>&1 </dev/null &
}

# --- the network ---------------------------------------------------------------------------

# No IPv6 on the root namespace's side of the cluster (the bridge, the hosts' veth ends):
# the kernel gives a link an IPv6 link-local address each time it comes up, a moment
# after the `ip` command (outside network_change's lock), and Chromium aborts its
# requests whenever a root-namespace address appears (tests/support/host_network.py).
# `plug db-b` brings db-b's veth end up again mid-test, beside the other pass's browser
# tests (`ip monitor address` shows the fe80:: address appear), the likely cause of a page
# that lost its scripts to net::ERR_NETWORK_CHANGED there. The cluster speaks IPv4 only.
root_link() {  # an interface just made in the root namespace, before it is set up
  local knob=/proc/sys/net/ipv6/conf/$1/disable_ipv6
  if [ -w "$knob" ]; then echo 1 >"$knob"; fi
}

net_up() {
  ip link add "$BRIDGE" type bridge
  root_link "$BRIDGE"
  ip addr add "$ROOT_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local host
  for host in "${HOSTS[@]}"; do
    ip netns add "$(ns "$host")"
    ip -n "$(ns "$host")" link set lo up
    ip link add "$(root_veth "$host")" type veth peer name "$P-$host-f"
    root_link "$(root_veth "$host")"
    ip link set "$P-$host-f" netns "$(ns "$host")"
    ip -n "$(ns "$host")" link set "$P-$host-f" name eth0
    ip -n "$(ns "$host")" addr add "$(front_addr "$host")/24" dev eth0
    ip -n "$(ns "$host")" link set eth0 up
    ip link set "$(root_veth "$host")" master "$BRIDGE" up
  done
  for host in "${APPS[@]}"; do
    # db0 on the app host <-> to-app-a / to-app-b on db.
    ip link add "$P-$host-d" type veth peer name "$P-db-$host"
    ip link set "$P-$host-d" netns "$(ns "$host")"
    ip link set "$P-db-$host" netns "$(ns db)"
    ip -n "$(ns "$host")" link set "$P-$host-d" name db0
    ip -n "$(ns db)" link set "$P-db-$host" name "to-$host"
    ip -n "$(ns "$host")" addr add "$(app_side "$host")/30" dev db0
    ip -n "$(ns db)" addr add "$(db_side "$host")/30" dev "to-$host"
    ip -n "$(ns "$host")" link set db0 up
    ip -n "$(ns db)" link set "to-$host" up
  done
  for host in "${HOSTS[@]}"; do
    if [ -n "$(ip -n "$(ns "$host")" route show default)" ]; then
      die "$host has a default route; refusing to go on (traffic must stay on this machine)"
    fi
  done
}

net_down() {
  local host
  # A veth pair goes with either end (asynchronously): whatever is gone already is fine.
  for host in "${HOSTS[@]}"; do
    ip link del "$(root_veth "$host")" 2>/dev/null || true
    if exists "$host"; then ip netns del "$(ns "$host")"; fi
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# --- db: PostgreSQL and Redis ------------------------------------------------------------

pg_bin() {
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  dirname "$(command -v pg_ctl)"
}

# From /: the postgres user may not enter the clone we were started in.
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

db_up() {
  local bin pgdir=$STATE/db/pg listen
  bin=$(pg_bin)
  mkdir -p "$pgdir"
  chown postgres: "$pgdir"
  as_postgres "$bin/initdb" -D "$pgdir/data" -U postgres -A trust --no-sync -E UTF8 >"$pgdir/initdb.log" 2>&1 \
    || die "initdb failed (see $pgdir/initdb.log)"
  # Trust on the cluster's own networks only (the namespaces reach nothing else).
  echo "host all all $NET.0.0/16 trust" >>"$pgdir/data/pg_hba.conf"
  listen="127.0.0.1,$(front_addr db),$(db_side app-a),$(db_side app-b)"
  # As scripts/pg.sh, plus server-side keepalives matching the product's client side, and
  # a log line for every lock waited on longer than a second (a cut-off host's open
  # transaction holding the others up shows there).
  (cd / && on db runuser -u postgres -- "$bin/pg_ctl" -D "$pgdir/data" -l "$pgdir/server.log" -w -t 60 \
    -o "-p $PG_PORT -k $pgdir -c listen_addresses=$listen -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c log_lock_waits=on -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=2" \
    start >/dev/null) || die "PostgreSQL did not start (see $pgdir/server.log)"
  (cd / && on db runuser -u postgres -- "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres agentloop)
  mkdir -p "$STATE/db/redis"
  daemon db redis redis-server --port "$REDIS_PORT" --bind "127.0.0.1 $(front_addr db) $(db_side app-a) $(db_side app-b)" \
    --protected-mode no --save "" --appendonly no --dir "$STATE/db/redis"
  local deadline=$((SECONDS + 20))
  until on db redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "redis-server did not answer (see $STATE/db/redis.log)"
    sleep 0.2
  done
}

# --- app hosts ---------------------------------------------------------------------------

# The app hosts' settings from the caller's environment, kept for `start` after a kill.
save_env() {
  local v
  for v in $(compgen -e); do
    case $v in
      AGENTLOOP_*|LOG_LEVEL|DJANGO_Q_LOG_LEVEL|Q_WORKERS|DEBUG|ACCESS_LOG|SECRET_KEY|CONN_*|DATABASE_POOL|DATABASE_*TIMEOUT|DATABASE_KEEPALIVES_IDLE)
        printf 'export %s=%q\n' "$v" "${!v}";;
    esac
  done >"$STATE/env"
}

app_env() {
  local host=$1
  # shellcheck disable=SC1091
  [ -f "$STATE/env" ] && . "$STATE/env"
  export DATABASE_URL="postgres://postgres@$(db_side "$host"):$PG_PORT/agentloop"
  export REDIS_URL="redis://$(db_side "$host"):$REDIS_PORT/0"
  if ha; then
    DATABASE_URL=$(ha_database_url)
    REDIS_URL="redis://$(ha_addr dcs):$REDIS_PORT/0"
  fi
  # The host's own name (as its UTS namespace says): a setting from `up` never makes two hosts one.
  export AGENTLOOP_HOSTNAME=$host
  export HOST=$(front_addr "$host") PORT=$WEB_PORT
  export ALLOWED_HOSTS="$(front_addr "$host"),127.0.0.1,localhost"
  export DJANGO_SETTINGS_MODULE=agentloop.settings PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
}

migrate() {
  (app_env app-a; on app-a "$PY" manage.py migrate --verbosity 0) >"$STATE/migrate.log" 2>&1 \
    || die "migrate failed (see $STATE/migrate.log)"
}

# What `make run` (manage.py runall) starts, as separate processes: daphne and the worker
# loop on every app host, django-q2's cluster on one.
app_start() {
  local host=$1 addr
  addr=$(front_addr "$host")
  (
    app_env "$host"
    cd "$CLONE"
    daemon "$host" web "$PY" -m agentloop.web_server --host "$addr" --port "$WEB_PORT"
    daemon "$host" worker "$PY" manage.py runloop
    if [ "$host" = "$TASKS_HOST" ]; then daemon "$host" tasks "$PY" manage.py qcluster; fi
  )
}

wait_web() {
  local host=$1 deadline=$((SECONDS + 90)) url
  url="http://$(front_addr "$host"):$WEB_PORT/healthz"
  until "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$url" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || die "$host's web server did not answer $url (see $STATE/$host/web.log)"
    sleep 0.3
  done
}

pids_on() { exists "$1" && ip netns pids "$(ns "$1")" || true; }

kill_host_process() {  # a host, a command name: SIGKILL its processes of that name there
  local pid
  for pid in $(pids_on "$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

kill_host() {
  local host=$1 signal=${2:-KILL} deadline pids
  pids=$(pids_on "$host")
  [ -n "$pids" ] && kill -"$signal" $pids 2>/dev/null || true
  deadline=$((SECONDS + ${3:-10}))
  while [ -n "$(pids_on "$host")" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  [ -z "$(pids_on "$host")" ]
}

# --- commands ------------------------------------------------------------------------------

up() {
  local with_ha=${1:-}
  need_root up
  need_netns
  if exists db || ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "a cluster with prefix '$P' is up already (CLUSTER_PREFIX=$P scripts/cluster.sh status, or … down)"
  fi
  [ -x "$PY" ] || { make .venv/.installed-dev && "$PY" -m compileall -q -j 0 .venv/lib >/dev/null; }
  command -v redis-server >/dev/null 2>&1 || die "redis-server is missing (scripts/system-deps.sh installs it)"
  rm -rf "$STATE"
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  save_env
  if [ "$with_ha" = --ha ]; then
    command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 \
      || die "patroni and etcd are missing (scripts/system-deps.sh installs them)"
    touch "$STATE/ha"
    ha_hosts
  fi
  trap '[ -n "$BUILT" ] || [ -n "${CLUSTER_KEEP_FAILED:-}" ] || { echo "cluster: up failed; taking down what was built" >&2; down >/dev/null 2>&1; }' EXIT
  say "network: bridge $BRIDGE $ROOT_ADDR/24, hosts ${HOSTS[*]}"
  if ha; then
    network_change ha_net_up
    say "dcs: etcd and Redis on $(ha_addr dcs)"
    dcs_up
    say "db-a, db-b: Patroni, a primary and its synchronous replica"
    ha_db_up
  else
    network_change net_up
    say "db: PostgreSQL and Redis on $(front_addr db)"
    db_up
  fi
  say "migrating"
  migrate
  if ha; then ha_db_synchronous; fi
  local host
  for host in "${APPS[@]}"; do app_start "$host"; done
  for host in "${APPS[@]}"; do wait_web "$host"; done
  BUILT=1
  say "up"
  status
}

# Every process of the hosts stopped; the hosts and the bridge stay (down removes them).
stop_hosts() {
  local host bin
  if ha; then
    ha_stop
    return 0
  fi
  # The data goes with the hosts: a short grace, then SIGKILL.
  for host in "${APPS[@]}"; do kill_host "$host" TERM 5 || kill_host "$host" KILL; done
  if [ -f "$STATE/db/pg/data/postmaster.pid" ]; then
    bin=$(pg_bin)
    as_postgres "$bin/pg_ctl" -D "$STATE/db/pg/data" -m fast -w -t 10 stop >/dev/null 2>&1 || true
  fi
  kill_host db TERM 5 || kill_host db KILL
}

down() {
  need_root down
  stop_hosts
  if ha; then network_change ha_net_down; else network_change net_down; fi
  rm -rf "$STATE"
  say "down"
}

status() {
  local host addrs
  if ! exists "${HOSTS[0]}" && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    say "not up (prefix $P)"
    return 0
  fi
  echo "root namespace: bridge $BRIDGE $ROOT_ADDR (load generator, local Bot API)"
  for host in "${HOSTS[@]}"; do
    if ! exists "$host"; then echo "$host: missing"; continue; fi
    addrs=$(ip -n "$(ns "$host")" -br addr | awk '$1 != "lo" {printf "%s %s %s; ", $1, $2, $3}')
    echo "$host (namespace $(ns "$host")): $addrs"
    local pids
    pids=$(pids_on "$host")
    if [ -n "$pids" ]; then
      ps -o pid=,etime=,args= -p "$(echo $pids | tr ' ' ,)" | cut -c1-150 | sed 's/^/    /'
    else
      echo "    (no processes)"
    fi
  done
  echo "web:      http://$(front_addr app-a):$WEB_PORT/  http://$(front_addr app-b):$WEB_PORT/"
  if ha; then
    echo "database: $(ha_database_url)   (primary now: $(ha_primary || echo none))"
    echo "redis:    redis://$(ha_addr dcs):$REDIS_PORT/0"
  else
    echo "database: postgres://postgres@$(front_addr db):$PG_PORT/agentloop   (from this namespace)"
    echo "redis:    redis://$(front_addr db):$REDIS_PORT/0"
  fi
  echo "logs:     $STATE/<host>/*.log"
}

app_host() { case ${1:-} in app-a|app-b) ;; *) die "which host? app-a or app-b";; esac; }
# unplug/plug: an app host's db link, or (--ha) a database host's whole link.
link_of() { case ${1:-} in app-a|app-b) echo db0;; db-a|db-b) ha || die "not an --ha cluster"; echo eth0;;
            *) die "which host? app-a, app-b (or db-a, db-b with --ha)";; esac; }

case ${1:-} in
  up) up "${2:-}" ;;
  down) down ;;
  stop) need_root stop; stop_hosts; say "every process of the hosts stopped (down removes the hosts)" ;;
  status) status ;;
  check) need_root check; need_netns; say "root, and network namespaces work: ready for up" ;;
  kill) app_host "${2:-}"; need_root kill; kill_host "$2" KILL || die "processes left on $2"; say "$2: every process killed" ;;
  start) app_host "${2:-}"; need_root start; exists "$2" || die "not up"
         [ -z "$(pids_on "$2")" ] || die "$2 still runs processes (kill it first)"
         app_start "$2"; wait_web "$2"; say "$2: started" ;;
  unplug) link=$(link_of "${2:-}"); need_root unplug; ip -n "$(ns "$2")" link set "$link" down; say "$2: $link down" ;;
  plug) link=$(link_of "${2:-}"); need_root plug; ip -n "$(ns "$2")" link set "$link" up; say "$2: $link up" ;;
  pgkill) db_host "${2:-}"; need_root pgkill; ha || die "not an --ha cluster"; pg_kill "$2"; say "$2: PostgreSQL killed" ;;
  primary) ha || die "not an --ha cluster"; ha_primary || die "no primary now" ;;
  redis) ha || die "not an --ha cluster"; need_root redis
         case ${2:-} in
           stop) kill_host_process dcs redis-server; say "redis stopped" ;;
           start) daemon dcs redis redis-server --port "$REDIS_PORT" --bind "127.0.0.1 $(ha_addr dcs)" \
                    --protected-mode no --save "" --appendonly no --dir "$STATE/dcs/redis"; say "redis started" ;;
           *) die "redis stop|start" ;;
         esac ;;
  _on) shift; exec_on "$@" ;;  # internal: `daemon` runs a host's process through this
  *) echo "usage: $0 up [--ha]|down|stop|status|check|kill HOST|start HOST|unplug HOST|plug HOST|pgkill DBHOST|primary|redis stop|start" >&2; exit 2 ;;
esac
