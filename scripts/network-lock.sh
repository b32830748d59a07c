# network_change: sourced by scripts/cluster.sh (and tests/unit/test_host_network.py).
#
# The tests run browsers beside the cluster, and Chromium aborts its requests when an
# address of the root namespace appears or goes (tests/support/host_network.py). With
# CLUSTER_NETWORK_LOCKS naming that module's folder, a change of the root namespace's
# network waits for the browsers alive (at most CLUSTER_NETWORK_WAIT, 300 s) and holds the
# lock exactly as long as the change takes: not while the hosts start or stop, which had
# a browser test wait 16-25 s and the cluster test's teardown 50 s. By hand (no such
# folder) it just runs.

NETWORK_LOCK_FDS=""  # the lock's and the turnstile's descriptors while a change holds them

network_change() {  # a command that changes the root namespace's network
  # Not asked for, or held already: a failed change exits the script (set -e), and the
  # EXIT trap's `down` changes the network again, still holding them.
  if [ -z "${CLUSTER_NETWORK_LOCKS:-}" ] || [ -n "$NETWORK_LOCK_FDS" ]; then "$@"; return; fi
  local turnstile lock wait=${CLUSTER_NETWORK_WAIT:-300} rc
  # The turnstile first, as host_network.changing(): a browser that comes after a waiting
  # change waits behind it.
  exec {turnstile}>>"$CLUSTER_NETWORK_LOCKS/host-network.turnstile"
  if ! flock -x -w "$wait" "$turnstile"; then
    exec {turnstile}>&-
    echo "the host-network turnstile was not free within $wait s" >&2
    return 1
  fi
  exec {lock}>>"$CLUSTER_NETWORK_LOCKS/host-network.lock"
  if ! flock -x -w "$wait" "$lock"; then
    exec {lock}>&- {turnstile}>&-
    echo "the host-network lock was not free within $wait s (a browser alive that long?)" >&2
    return 1
  fi
  NETWORK_LOCK_FDS="$lock $turnstile"
  # Not `"$@" || …`: that would turn set -e off inside the command.
  "$@"
  rc=$?
  # Closed here: no process the caller starts later may inherit (and so hold) them.
  exec {lock}>&- {turnstile}>&-
  NETWORK_LOCK_FDS=""
  return $rc
}
