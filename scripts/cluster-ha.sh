# The database as production runs it: a primary and a synchronous replica under Patroni,
# etcd as Patroni's consensus store (both from the distribution's packages). Sourced by
# scripts/cluster.sh for `up --ha`; docs/scaling-out.md ("When the database fails over").
#
#   dcs    NET.0.3   etcd :2379 (Patroni's leader key) and redis-server :6379
#   db-a   NET.0.2   Patroni :8008 and PostgreSQL :5432 (the first primary)
#   db-b   NET.0.4   Patroni :8008 and PostgreSQL :5432 (its synchronous replica)
#
# The app hosts reach both over the bridge through one libpq multi-host URL,
# `host=db-a,db-b target_session_attrs=read-write`: libpq tries each and keeps the one that
# takes writes, so a new connection after a failover finds the new primary with no proxy
# in between (HAProxy with Patroni's health checks would be one more hop and one more
# process to fail; docs/scaling-out.md says when to choose it).
#
# Failover settings (Patroni's DCS settings, below), chosen for the test's ≤ 15 s:
#   ttl 7, loop_wait 1, retry_timeout 3 (ttl ≥ loop_wait + 2 × retry_timeout, as Patroni's
#     docs ask, at its least): a primary cut off from etcd loses the leader key within 7 s and demotes
#     itself (read-only) once it cannot renew it;
#   primary_start_timeout 0: a crashed primary is failed over at once, not restarted in place;
#   maximum_lag_on_failover 16 MiB: Patroni compares a candidate's WAL with the primary's
#     pg_current_wal_lsn() as last written to etcd, which under load may run ahead of what
#     the replica received (WAL of commits still waiting for its ack). A candidate found
#     "lagging" (or not answering Patroni's REST API within 2 s) makes Patroni restart a
#     crashed primary in place instead; CI once met one of the two, its log not kept. The
#     limit guards asynchronous replicas: here only the synchronous replica may be
#     promoted, and it holds every commit the product was told of;
#   synchronous_mode: a commit is acknowledged once it is on the replica too, and only a
#     synchronous replica may be promoted, so what the product acknowledged survives;
#   use_pg_rewind (wal_log_hints on): the old primary rejoins as a replica.

DB_HOSTS=(db-a db-b)
PATRONI_PORT=8008 ETCD_PORT=2379

ha_addr() { case $1 in dcs) echo "$NET.0.3";; db-a) echo "$NET.0.2";; db-b) echo "$NET.0.4";; esac; }

ha_hosts() {  # the hosts of an HA cluster, in the order they are built
  HOSTS=(dcs db-a db-b app-a app-b)
}

# The bridge only: every host on it (the app hosts' own db links are for the single
# database's drills, `unplug app-b`; here `unplug db-a` cuts the primary's whole link).
ha_net_up() {
  ip link add "$BRIDGE" type bridge
  root_link "$BRIDGE"  # no IPv6 on the root namespace's side (scripts/cluster.sh)
  ip addr add "$ROOT_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local host addr
  for host in "${HOSTS[@]}"; do
    addr=$(ha_front_addr "$host")
    ip netns add "$(ns "$host")"
    ip -n "$(ns "$host")" link set lo up
    ip link add "$P-$host" type veth peer name "$P-$host-f"
    root_link "$P-$host"
    ip link set "$P-$host-f" netns "$(ns "$host")"
    ip -n "$(ns "$host")" link set "$P-$host-f" name eth0
    ip -n "$(ns "$host")" addr add "$addr/24" dev eth0
    ip -n "$(ns "$host")" link set eth0 up
    ip link set "$P-$host" master "$BRIDGE" up
    [ -z "$(ip -n "$(ns "$host")" route show default)" ] || die "$host has a default route; refusing to go on"
  done
}

ha_front_addr() { case $1 in app-a|app-b) front_addr "$1";; *) ha_addr "$1";; esac; }

ha_net_down() {
  local host
  for host in dcs db-a db-b app-a app-b; do
    ip link del "$P-$host" 2>/dev/null || true
    if exists "$host"; then ip netns del "$(ns "$host")"; fi
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# --- dcs: etcd and Redis -------------------------------------------------------------------

dcs_up() {
  local dir=$STATE/dcs addr deadline
  addr=$(ha_addr dcs)
  mkdir -p "$dir/etcd" "$dir/redis"
  chown etcd: "$dir/etcd"
  chmod 700 "$dir/etcd"
  # etcd as its own user, one member, in a folder it owns.
  mkdir -p "$STATE/dcs"
  setsid nohup "$SELF" _on dcs runuser -u etcd -- etcd --name dcs --data-dir "$dir/etcd/data" \
    --listen-client-urls "http://$addr:$ETCD_PORT,http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://$addr:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:2380" --initial-advertise-peer-urls "http://127.0.0.1:2380" \
    --initial-cluster "dcs=http://127.0.0.1:2380" --unsafe-no-fsync \
    >>"$STATE/dcs/etcd.log" 2>&1 </dev/null &
  daemon dcs redis redis-server --port "$REDIS_PORT" --bind "127.0.0.1 $addr" \
    --protected-mode no --save "" --appendonly no --dir "$dir/redis"
  deadline=$((SECONDS + 20))
  until on dcs etcdctl --endpoints "http://127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "etcd did not answer (see $STATE/dcs/etcd.log)"
    sleep 0.2
  done
  until on dcs redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "redis-server did not answer (see $STATE/dcs/redis.log)"
    sleep 0.2
  done
}

# --- db-a, db-b: Patroni ---------------------------------------------------------------------

patroni_config() {  # a db host: its patroni.yml
  local host=$1 addr bin
  addr=$(ha_addr "$host")
  bin=$(pg_bin)
  cat <<EOF
scope: agentloop
namespace: /service/
name: $host
log:
  level: INFO
restapi:
  listen: $addr:$PATRONI_PORT
  connect_address: $addr:$PATRONI_PORT
etcd3:
  host: $(ha_addr dcs):$ETCD_PORT
bootstrap:
  dcs:
    ttl: 7
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 16777216
    primary_start_timeout: 0
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 200
        # As scripts/pg.sh: no fsync on a test machine (a SIGKILLed server's writes are in the
        # kernel's cache and survive; production keeps fsync on). synchronous_commit stays on:
        # it is what makes a commit wait for the replica.
        fsync: "off"
        full_page_writes: "on"
        log_lock_waits: "on"
        tcp_keepalives_idle: 10
        tcp_keepalives_interval: 5
        tcp_keepalives_count: 2
  initdb:
  - encoding: UTF8
  - auth: trust
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication replicator $NET.0.0/16 trust
  - host all all $NET.0.0/16 trust
postgresql:
  listen: $addr,127.0.0.1:$PG_PORT
  connect_address: $addr:$PG_PORT
  data_dir: $STATE/$host/pg/data
  bin_dir: $bin
  pgpass: $STATE/$host/pg/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: $STATE/$host/pg
  # A new replica's copy starts at once: a spread checkpoint would make it wait minutes.
  basebackup:
  - checkpoint: fast
tags:
  nofailover: false
  noloadbalance: false
EOF
}

patroni_start() {  # a db host: Patroni (and through it PostgreSQL) as the postgres user
  local host=$1 dir=$STATE/$1
  mkdir -p "$dir/pg"
  chown -R postgres: "$dir/pg"
  patroni_config "$host" >"$dir/patroni.yml"
  chown postgres: "$dir/patroni.yml"
  setsid nohup "$SELF" _on "$host" runuser -u postgres -- patroni "$dir/patroni.yml" \
    >>"$dir/patroni.log" 2>&1 </dev/null &
}

# Patroni's REST API answers 200 on /primary from the primary, on /sync from a
# synchronous replica that streams: what `role` asks.
role_is() {  # a db host, primary|sync|replica|health
  "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
    "http://$(ha_addr "$1"):$PATRONI_PORT/$2" 2>/dev/null
}

wait_role() {  # a db host, a role, seconds
  local deadline=$((SECONDS + $3))
  until role_is "$1" "$2"; do
    [ $SECONDS -lt $deadline ] || die "$1 did not become $2 within $3 s (see $STATE/$1/patroni.log)"
    sleep 0.2
  done
}

# db-a bootstraps the cluster; db-b copies it (pg_basebackup) while the caller migrates,
# and is waited for as a streaming synchronous replica by ha_db_synchronous.
ha_db_up() {
  patroni_start db-a
  wait_role db-a primary 60
  (cd / && on db-a runuser -u postgres -- "$(pg_bin)/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres agentloop)
  patroni_start db-b
}

ha_db_synchronous() { wait_role db-b sync 90; }

ha_database_url() {  # as the app hosts (and the root namespace) reach it
  echo "postgres://postgres@$(ha_addr db-a):$PG_PORT,$(ha_addr db-b):$PG_PORT/agentloop?target_session_attrs=read-write"
}

ha_primary() {  # the db host Patroni says is primary now, or nothing
  local host
  for host in "${DB_HOSTS[@]}"; do
    if role_is "$host" primary; then echo "$host"; return 0; fi
  done
  return 1
}

# SIGKILL the postmaster (its children die with it): PostgreSQL lost, Patroni left running
# on the host, as when the server process crashes or is OOM-killed.
pg_kill() {
  local pidfile=$STATE/$1/pg/data/postmaster.pid pid
  [ -f "$pidfile" ] || die "$1 runs no PostgreSQL"
  pid=$(head -1 "$pidfile")
  kill -KILL "$pid"
}

db_host() { case ${1:-} in db-a|db-b) ;; *) die "which database host? db-a or db-b";; esac; }

ha_stop() {
  local host
  for host in app-a app-b; do kill_host "$host" TERM 5 || kill_host "$host" KILL; done
  # The data goes with the hosts: no clean shutdown to wait for (a demoting Patroni waited
  # 10 s and more on a walsender whose standby was cut off).
  for host in db-a db-b dcs; do kill_host "$host" KILL; done
}
